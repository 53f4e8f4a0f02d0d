"""What a traced program runs on in place of its inputs: the proxies of its tensor inputs and the
module's parameters and buffers (``TracedInputs``), the size inputs of its symbolic sizes
(``SizeInputs``), and the stand-ins put for the symbolic sizes and ints that argument objects and
modules hold while it is traced (``put_stand_ins``, ``int_stand_ins``, taken out by ``put_back``)."""

from dataclasses import dataclass
from typing import Any

import torch

from thunder_rs.core.acquisition.dynamic import FLOAT, INT, ArgInt, HeldDim, HeldInt, HeldStride, in_other_items
from thunder_rs.core.acquisition.float_args import ArgFloat, HeldFloat
from thunder_rs.core.acquisition.returned_objects import MadeObjects
from thunder_rs.core.base.layouts import STRIDE
from thunder_rs.core.lang import symfloat, symint
from thunder_rs.core.lang.recorder import Captures, input_proxy
from thunder_rs.core.state.guards import ModuleSource, attributes_of, items_of
from thunder_rs.core.state.reached import ArgumentObjects, ArgumentTensor
from thunder_rs.core.state.tensor_guards import tensor_meta
from thunder_rs.errors import ThunderNotImplementedError


class TracedInputs:
    """The trace's tensor inputs: the arguments' proxies (at ``positions`` of the flat inputs),
    then the module's parameters and buffers; and each parameter or buffer slot of the module
    tree as ``(user's store, name, clone's store, proxy put there)``."""

    def __init__(self, positions, args: list, params: list, slots: list):
        self.positions, self.args, self.params, self.slots = tuple(positions), args, params, slots
        #: the new contents of the lists and dicts passed as arguments that the program changed
        #: (``argument_containers``): ``(ArgumentContainer, None, contents)``
        self.argument_writes: list = []
        #: the objects the program returned that it made (``returned_objects.made_objects``)
        self.made_objects: MadeObjects | None = None
        #: the copies of the arguments' lists and dicts, by id (``TracedContainers.copies``)
        self.argument_copies: dict = {}
        #: what the program returned, as it returned it (``returned_identities.origins``)
        self.returned: Any = None
        #: what it stored on its state and what it reached from its arguments (``returned_identities.places``)
        self.places: dict = {}
        #: the user's module of each clone the program ran on, by the clone's id
        self.modules: dict = {}
        #: ``(clone's store, name)`` of the buffers the forward registered (``modules.BufferRegistrar``)
        self.registered: list = []

    def slot_values(self) -> list:
        """``(user's store, name, input proxy, value in the clone's slot now)`` per slot."""
        return [(store, name, put, clone_store.get(name)) for store, name, clone_store, put in self.slots]

    def placed(self) -> list:
        """``(clone's store, name)`` per slot: references of thunder_rs's own, not stores of the
        program's elsewhere (``escapes._held_by_clones``)."""
        return [(clone_store, name) for _, name, clone_store, _ in self.slots] + self.registered


def kept_slots(slots: list) -> dict:
    """The module's parameters and buffers by the id of their input proxies."""
    return {id(put): store[name] for store, name, _, put in slots if isinstance(store.get(name), torch.Tensor)}


def refuse_uninitialized(names, tensors) -> None:
    for name, t in zip(names, tensors):
        if torch.nn.parameter.is_lazy(t):
            raise ThunderNotImplementedError(
                f"jit: parameter or buffer {name} is not initialised yet (a lazy module such as nn.LazyLinear infers "
                "its shape on its first call); run one eager forward first, then call the jitted module"
            )


class SizeInputs:
    """The size inputs of one acquisition: the ``sizes`` (``(flat position, dim)``) of the flat
    inputs and the ``held`` dims of argument objects' tensors (``{(source key, name): dims}``) to
    trace as symbolic. One size input per distinct value, as torch.compile's duck sizing (the
    ids, labels and mask of a batch share their length, so ``ids.numel() // labels.size(1)``
    divides as data); the entry checks that the sizes that share one are equal on each call
    (``core.acquisition.dynamic``). Except between items of lists at other indices (``paths``,
    each flat input's, ``dynamic.leaf_paths``; ``dynamic.in_other_items``): two images' box
    counts are equal by chance, and a size input shared there would make the next call where
    they differ compile again; where the program relies on their equality (``torch.stack``),
    the trace guards it."""

    def __init__(self, rec, sizes, held, paths=None, floats=()):
        self._rec, self.flat, self.held, self._paths = rec, sizes, held or {}, paths
        #: the positions of the float arguments to take as inputs, and ``(ArgFloat, value id)`` of each made
        self.float_positions, self.floats = floats, []
        self._by_value: dict = {}
        #: where each size input is read, in the order made (the trace's order)
        self.sources: list = []
        #: ``(where, index of the size input)`` of the other places holding its value
        self.shared: list = []
        #: the ints read as sizes (``ArgInt``, then ``HeldInt``), numbered in the order made
        self.ints = 0

    def of(self, n: int, at):
        """The size input for the size ``n`` read at ``at``."""
        made = self._by_value.setdefault(n, [])
        found = next((m for m in made if not self._apart(self.sources[m[0]], at)), None)
        if found is None:
            found = (len(self.sources), self._rec.size_input(n))
            made.append(found)
            self.sources.append(at)
        else:
            self.shared.append((at, found[0]))
        return found[1]

    def _apart(self, a, b) -> bool:
        """Whether the sizes at ``a`` and ``b`` are of flat inputs in different items of a list."""
        if self._paths is None or type(a) is not tuple or type(b) is not tuple or a[1] is None or b[1] is None:
            return False
        return in_other_items(self._paths[a[0]], self._paths[b[0]])

    def of_inputs(self, flat_inputs) -> dict:
        """The size inputs of the flat inputs' symbolic dims: ``{position: {dim: size}}`` (dim
        None: the int argument at that position; ``(STRIDE, d)``: a strided tensor's stride)."""
        made: dict = {}
        for i, d in self.flat:
            if d is None:
                made[i] = {None: self.of(flat_inputs[i], ArgInt(i, self.next_int()))}
            elif type(d) is tuple:
                made.setdefault(i, {})[d] = self.of(flat_inputs[i].stride(d[1]), (i, d))
            else:
                made.setdefault(i, {})[d] = self.of(flat_inputs[i].shape[d], (i, d))
        return made

    def float_of(self, value: float, at):
        """A float input for the float ``value`` read at ``at`` (``ArgFloat`` or ``HeldFloat``)."""
        vid = self._rec.float_input(value)
        self.floats.append((at, vid))
        return symfloat.float_input(vid, value)

    def next_int(self) -> int:
        """The number of the next int read as a size among the entry's last inputs."""
        self.ints += 1
        return self.ints - 1


def put_stand_ins(reached: ArgumentObjects, captures: Captures, size_inputs: SizeInputs, first_input: int) -> list:
    """Puts in place of each argument object's tensor that has symbolic dims a proxy of those
    sizes (and strides, ``HeldStride``), so that the program reads them as sizes
    (``cache.get_seq_length()``); the trace takes it as a captured input (the ``first_input``-th
    trace input is the first captured). Returns ``(attributes, ArgumentTensor, tensor)`` for
    ``put_back``. Sizes 0 and 1 stay constant. A tensor dense in another order (a state kept
    transposed) has the strides of its symbolic sizes in that order (``recorder.input_proxy``)."""
    placed: list = []
    for at in list(reached.tensors.values()) if size_inputs.held else ():
        dims = size_inputs.held.get((at.source.key, at.name))
        attributes: Any = _slots_of(at.holder) if dims else None
        t = attributes.get(at.name) if attributes is not None else None
        if not isinstance(t, torch.Tensor) or t.layout is not torch.strided:
            continue
        sized, strided = _symbolic_dims(t, dims)
        at.symbolic = frozenset((*sized, *((STRIDE, d) for d in strided)))
        if at.symbolic:
            placed.append(_stand_in(attributes, at, t, (sized, strided), captures, size_inputs, first_input))
    return placed


def _stand_in(attributes, at, t: torch.Tensor, dims: tuple, captures: Captures, size_inputs, first_input: int):
    """Puts in ``attributes`` at ``at.name`` a proxy of ``t`` whose ``dims`` (``(sized, strided)``)
    are the size inputs read from ``at`` by every call; returns what ``put_back`` takes."""
    sized, strided = dims
    index = first_input + len(captures.tensors)
    sizes = {d: size_inputs.of(t.shape[d], HeldDim(at.source, at.name, d, index)) for d in sized}
    strides = {d: size_inputs.of(t.stride(d), HeldStride(at.source, at.name, d, index)) for d in strided}
    at.stand_in = attributes[at.name] = captures.proxy(t, sizes, {d: symint.wrap(s) for d, s in strides.items()})
    return attributes, at, t


def module_stand_ins(captures: Captures, size_inputs: SizeInputs, pairs: list, first_input: int) -> list:
    """Puts in place of each tensor a module keeps as a plain attribute (not a parameter or
    buffer) that has symbolic dims a proxy of those sizes, in its clone (``pairs``: ``(clone,
    original)``), read by every call from the original (``reached.ArgumentTensor``): a recurrent
    layer's state the program sets on each call (RecurrentGemma's ``conv1d_state`` and
    ``recurrent_states``), whose batch is the input's. Returns what ``put_back`` takes."""
    placed: list = []
    originals = {id(o): (c, o) for c, o in pairs} if size_inputs.held else {}
    for (key, name), dims in size_inputs.held.items():
        clone, original = originals.get(key, (None, None))
        t = attributes_of(clone).get(name) if clone is not None else None
        if not isinstance(t, torch.Tensor) or t.layout is not torch.strided or t.requires_grad:
            continue
        sized, strided = _symbolic_dims(t, dims)
        if not sized and not strided:
            continue
        at = ArgumentTensor(ModuleSource(original, type(original).__name__), name, original, tensor_meta(t))
        at.symbolic = frozenset((*sized, *((STRIDE, d) for d in strided)))
        captures.hold(t, at)
        placed.append(_stand_in(attributes_of(clone), at, t, (sized, strided), captures, size_inputs, first_input))
    return placed


def _symbolic_dims(t: torch.Tensor, dims) -> tuple:
    """The dims of ``t`` whose sizes, and those whose strides (a strided tensor's, ``(STRIDE, d)``
    among ``dims``), are symbolic: those of 2 and up."""
    sized = [d for d in sorted(x for x in dims if type(x) is int) if d < t.dim() and t.shape[d] >= 2]
    if t.is_contiguous():
        return sized, []
    marked = sorted(x[1] for x in dims if type(x) is tuple and x[0] == STRIDE)
    return sized, [d for d in marked if d < t.dim() and t.stride(d) >= 2]


def int_stand_ins(reached: ArgumentObjects, size_inputs: SizeInputs, pairs: list) -> list:
    """Puts in place of each argument object's or module's int marked symbolic (``dynamic.HeldInt``:
    a count a KV cache keeps, a module's ``self.seen_tokens``) a ``SymInt`` of a size input, so
    that the program computes with it as a size and what it sets there (``count += 1``) is that
    call's. A module's is put in its clone (``pairs``: ``(clone, original)``), the entry reads it
    from the original. Returns what ``put_back`` takes; the entry reads the ints in this order
    after its tensors."""
    placed: list = []
    holders = {source.key: (obj, source) for obj, source, _ in reached.objects}
    holders.update((id(o), (c, ModuleSource(o, type(o).__name__))) for c, o in pairs)
    for (key, name), dims in size_inputs.held.items():
        found = holders.get(key) if INT in dims or FLOAT in dims else None
        if found is None:
            continue
        attributes: Any = attributes_of(found[0])  # reached objects and modules have an instance dict
        value = attributes.get(name)
        if type(value) is float and FLOAT in dims:  # (a float input, ``float_args.HeldFloat``)
            stand_in = size_inputs.float_of(value, HeldFloat(found[1], name, len(size_inputs.floats)))
            attributes[name] = stand_in
            placed.append((attributes, _PlacedInt(name, stand_in, found[1]), value))
            continue
        if type(value) is not int or value < 2 or INT not in dims:
            continue
        stand_in = symint.wrap(size_inputs.of(value, HeldInt(found[1], name, size_inputs.next_int())))
        attributes[name] = stand_in
        placed.append((attributes, _PlacedInt(name, stand_in, found[1]), value))
    return placed


@dataclass
class _PlacedInt:
    """An int ``int_stand_ins`` replaced, as ``put_back`` reads it."""

    name: str
    stand_in: object
    #: where the entry reads it (a ``guards.InputSource`` or ``ModuleSource``)
    source: object = None


def _slots_of(holder):
    """Where ``holder`` keeps its tensors by name: its attributes, or a list's or dict's items."""
    return items_of(holder) if type(holder) in (list, dict) else attributes_of(holder)


def put_back(placed: list, failed: bool = False) -> None:
    """Puts the tensors back where ``put_stand_ins`` put proxies the program did not replace (what
    it set there instead is one of its writes); everywhere when tracing ``failed``."""
    for attributes, at, t in placed:
        if failed or attributes.get(at.name) is at.stand_in:
            attributes[at.name] = t
        at.stand_in = None


def input_leaves(rec, flat_inputs, positions, size_inputs: "SizeInputs") -> list:
    """The flat inputs as the traced program gets them: a proxy for each tensor (at ``positions``;
    a tensor passed twice gets its first proxy), the symbolic int of an int argument read as a size,
    the symbolic float of a float argument taken as an input, the rest as they are."""
    leaves = list(flat_inputs)
    symbolic = size_inputs.of_inputs(flat_inputs)
    for i in positions:
        dims = symbolic.get(i, {})
        strides = {d[1]: symint.wrap(s) for d, s in dims.items() if type(d) is tuple}
        leaves[i] = input_proxy(rec, flat_inputs[i], {d: s for d, s in dims.items() if type(d) is int}, strides, i)
    for i, dims in symbolic.items():
        if None in dims:  # an int argument read as a size
            leaves[i] = symint.wrap(dims[None])
    for k, i in enumerate(size_inputs.float_positions):  # a float argument taken as an input
        leaves[i] = size_inputs.float_of(flat_inputs[i], ArgFloat(i, k))
    first = {id(flat_inputs[i]): i for i in positions}
    for i, x in enumerate(flat_inputs):
        if isinstance(x, torch.Tensor) and first[id(x)] != i:
            leaves[i] = leaves[first[id(x)]]
    return leaves
