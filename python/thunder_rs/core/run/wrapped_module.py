"""How a ``ThunderModule`` presents the module it wraps: its state dict has the wrapped module's
keys, so checkpoints move freely between ``model`` and ``thunder_rs.jit(model)``, and the wrapped
module's own methods (``jm.generate(...)``) call the module through the jit.

The wrapped module is the ThunderModule's submodule ``_model``, so torch would prefix every key
with ``_model.``. Two state-dict hooks strip that prefix on save and restore it on load; being
hooks, they also apply when the ThunderModule is itself a submodule of a bigger model (torch
passes each hook the module's own prefix). Parameters' and buffers' names come from
``named_modules``, which gives the wrapped module the wrapper's own name (a bigger model's names
follow: torch asks each submodule for its modules), so optimizer groups and name filters see
eager's names. Torch reaches a module's top-level tensors by name through its stores
(``torch.func.functional_call`` swaps ``module._parameters["scale"]``): the wrapper's stores
reach the wrapped module's by name (``WrappedStore``).
"""

import functools
import itertools
import types
import weakref

import torch

WRAPPED = "_model"


def _strip(state_dict: dict, prefix: str) -> None:
    """Renames ``{prefix}_model.{key}`` to ``{prefix}{key}`` in place, keeping the order."""
    inner = f"{prefix}{WRAPPED}."
    entries = [(k, state_dict.pop(k)) for k in list(state_dict) if k.startswith(inner)]
    state_dict.update((prefix + k[len(inner) :], v) for k, v in entries)
    metadata = getattr(state_dict, "_metadata", None)
    if metadata is not None:
        inner_module = inner[:-1]
        for k in [k for k in metadata if k == inner_module or k.startswith(inner)]:
            metadata[prefix + k[len(inner) :] if k != inner_module else prefix[:-1]] = metadata.pop(k)


def _save_hook(module, state_dict, prefix, local_metadata) -> None:
    _strip(state_dict, prefix)


def _add_prefix(state_dict: dict, prefix: str) -> None:
    """Renames ``{prefix}{key}`` to ``{prefix}_model.{key}`` in place (the inverse of ``_strip``)."""
    inner = f"{prefix}{WRAPPED}."
    keys = [k for k in list(state_dict) if k.startswith(prefix) and not k.startswith(inner)]
    for k in keys:
        state_dict[inner + k[len(prefix) :]] = state_dict.pop(k)
    metadata = getattr(state_dict, "_metadata", None)
    if metadata is not None:
        own = prefix[:-1]
        for k in [k for k in metadata if (k == own or k.startswith(prefix)) and not k.startswith(inner)]:
            metadata[inner + k[len(prefix) :] if k != own else inner[:-1]] = metadata.pop(k)


def _load_hook(module, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs) -> None:
    _add_prefix(state_dict, prefix)


def present_state_dict_as_wrapped(module: torch.nn.Module) -> None:
    """Makes ``module.state_dict()`` and ``module.load_state_dict()`` use the keys of
    ``module._model``."""
    module.register_state_dict_post_hook(_save_hook)
    module.register_load_state_dict_pre_hook(_load_hook)


def calling_through(wrapper, value):
    """``value``, read from the wrapped module as an attribute of ``wrapper``: a method of that
    module (``generate``) runs with the module's own calls (``self(**inputs)``) going through
    ``wrapper``, so they run compiled, while ``self`` stays the module (whose class, ``forward``
    signature and attributes the method inspects)."""
    module = getattr(value, "__self__", None)
    if not isinstance(value, types.MethodType) or not isinstance(module, torch.nn.Module):
        return value

    @functools.wraps(value)
    def method(*args, **kwargs):
        # ``nn.Module.__call__`` runs ``_compiled_call_impl`` when set (as ``nn.Module.compile``
        # does); set in the instance dict directly, as it is no module state guards watch.
        before = module.__dict__.get("_compiled_call_impl")
        object.__setattr__(module, "_compiled_call_impl", wrapper)
        try:
            return value(*args, **kwargs)
        finally:
            object.__setattr__(module, "_compiled_call_impl", before)

    return method


class WrappedStore(dict):
    """A ThunderModule's ``_parameters`` or ``_buffers``: its own entries (none, unless one is
    registered on the wrapper itself), and by name the wrapped module's, as torch reads, swaps
    and deletes a module's top-level tensors. Iterating yields its own entries only, so state
    dicts, ``_apply`` and names reach the wrapped module's tensors once, through the wrapped
    module. A copy (``type(store)(items)``, as tracing clones stores) is a plain store."""

    _wrapper: "weakref.ref[torch.nn.Module] | None" = None
    _store = ""

    @classmethod
    def reaching(cls, wrapper: torch.nn.Module, store: str) -> "WrappedStore":
        reaching = cls(wrapper.__dict__[store])
        reaching._wrapper, reaching._store = weakref.ref(wrapper), store  # the wrapper holds its stores
        return reaching

    def _reached(self, key):
        """The wrapped module's store, when it holds ``key`` and this store does not."""
        wrapper = self._wrapper() if self._wrapper is not None else None
        if wrapper is None or dict.__contains__(self, key):
            return None
        wrapped = wrapper.__dict__.get("_modules", {}).get(WRAPPED)
        target = None if wrapped is None else wrapped.__dict__.get(self._store)
        return target if target is not None and key in target else None

    def __contains__(self, key) -> bool:
        return dict.__contains__(self, key) or self._reached(key) is not None

    def __getitem__(self, key):
        target = self._reached(key)
        return dict.__getitem__(self, key) if target is None else target[key]

    def __setitem__(self, key, value) -> None:
        target = self._reached(key)
        if target is None:
            dict.__setitem__(self, key, value)
        else:
            target[key] = value

    def __delitem__(self, key) -> None:
        target = self._reached(key)
        if target is None:
            dict.__delitem__(self, key)
        else:
            del target[key]

    def get(self, key, default=None):
        return self[key] if key in self else default


def present_names_as_wrapped(module: torch.nn.Module) -> None:
    """Makes ``module._parameters`` and ``module._buffers`` reach ``module._model``'s by name."""
    for store in ("_parameters", "_buffers"):
        module.__dict__[store] = WrappedStore.reaching(module, store)


def named_modules_as_wrapped(wrapper: torch.nn.Module, memo, prefix: str, remove_duplicate: bool):
    """``wrapper.named_modules(...)``: the wrapper, then the wrapped module's modules under their
    names in eager (the wrapped module under the wrapper's own)."""
    memo = set() if memo is None else memo
    if wrapper in memo:
        return
    if remove_duplicate:
        memo.add(wrapper)
    yield prefix, wrapper
    for name, sub in wrapper._modules.items():
        if sub is not None:
            sub_prefix = prefix if name == WRAPPED else prefix + ("." if prefix else "") + name
            yield from sub.named_modules(memo, sub_prefix, remove_duplicate)


def named_tensors_as_wrapped(wrapper: torch.nn.Module, method: str, prefix: str, recurse: bool, remove_duplicate: bool):
    """``wrapper.named_parameters(...)`` or ``named_buffers`` (``method``) under the names eager
    gives them: with ``recurse=False`` the wrapped module's own, as the wrapper's."""
    named = getattr(torch.nn.Module, method)(wrapper, prefix, recurse, remove_duplicate)
    if recurse:
        return named
    return itertools.chain(named, getattr(wrapper._modules[WRAPPED], method)(prefix, False, remove_duplicate))


#: The container protocol a wrapped module's class may define (``nn.Sequential``, ``ModuleList``,
#: ``ModuleDict``, a user's module): the wrapper answers each as the wrapped module does.
_PROTOCOL = (
    "__len__",
    "__getitem__",
    "__setitem__",
    "__delitem__",
    "__iter__",
    "__reversed__",
    "__contains__",
    "__bool__",
    "__add__",
    "__radd__",
    "__mul__",
    "__rmul__",
)
#: In-place operators: the wrapped module's, then the wrapper itself (``jm += [layer]`` keeps ``jm``).
_IN_PLACE = ("__iadd__", "__imul__")
_with_protocol: dict = {}


def _forwarded(name: str):
    def method(self, *args):
        return getattr(self.__dict__["_modules"][WRAPPED], name)(*args)

    method.__name__ = name
    return method


def _in_place(name: str):
    def method(self, *args):
        getattr(self.__dict__["_modules"][WRAPPED], name)(*args)
        return self

    method.__name__ = name
    return method


def wrapper_class(base: type, wrapped: type) -> type:
    """``base`` (``ThunderModule``), or a subclass of it for a wrapped module whose class defines
    some of the container protocol beyond ``nn.Module`` (``len(jm)``, ``jm[0]``, ``jm[:2]``, ``for
    layer in jm``, ``bool(jm)`` of an empty ``nn.Sequential``): those methods, answered by the
    wrapped module. Only those: a wrapper of a module without ``__len__`` has none (``bool(jm)`` is
    True, as the module's). One class per wrapped class, named as ``base``."""
    names = [n for n in (*_PROTOCOL, *_IN_PLACE) if getattr(wrapped, n, None) is not getattr(torch.nn.Module, n, None)]
    if not names:
        return base
    key = (base, wrapped)
    cls = _with_protocol.get(key)
    if cls is None:
        methods = {n: (_in_place if n in _IN_PLACE else _forwarded)(n) for n in names}
        cls = _with_protocol[key] = type(base.__name__, (base,), {**methods, "__qualname__": base.__qualname__})
        cls.__module__ = base.__module__
    return cls
