"""The names traces give the program's inputs: the user's argument names with an ``l_`` prefix
(``l_x``, ``l_batch_input_ids``, ``l_args_0``) and the module's parameters and buffers by their
qualified names (``layers_0_attn_weight``; ``m_0_weight`` where the name starts with a digit,
as in ``nn.Sequential``). Captured tensors keep their ``tN``.

A name never shadows what generated code uses (``torch``, the executors' callables, constants,
``tN`` values), Python's keywords or builtins; repeated names get a ``_1``, ``_2`` suffix.
"""

import builtins
import keyword
import re


_GENERATED = re.compile(r"(t|_c)\d+")
_NOT_IDENTIFIER = re.compile(r"\W+")


def _identifier(text: str, prefix: str) -> str:
    name = prefix + _NOT_IDENTIFIER.sub("_", text).strip("_")
    if not name.isidentifier():  # empty, or starts with a digit
        name = f"m_{name}"
    if keyword.iskeyword(name) or hasattr(builtins, name) or _GENERATED.fullmatch(name):
        name += "_"
    return name


def trace_input_names(user: list[str], positions, params, num_inputs: int, taken, floats=()) -> list[str]:
    """One name per trace input ("" keeps the input's ``tN``): the flat inputs at ``positions``,
    then ``params`` (qualified names), then captured tensors; the last, the float inputs, the
    flat inputs at ``floats`` (None: a float a module or an argument object holds)."""
    wanted = [_identifier(user[i], "l_") for i in positions] + [_identifier(p, "") for p in params]
    wanted += [""] * (num_inputs - len(wanted) - len(floats))
    wanted += ["" if i is None else _identifier(user[i], "l_") for i in floats]
    seen = set(taken)
    names = []
    for name in wanted[:num_inputs]:
        if name:
            base, k = name, 0
            while name in seen:
                k += 1
                name = f"{base}_{k}"
            seen.add(name)
        names.append(name)
    return names
