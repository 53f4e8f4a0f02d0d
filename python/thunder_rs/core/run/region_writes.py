"""Which fusion regions may write a module's tensor themselves (``Region.writes``): where the
value a call writes back into a buffer without autograd (BatchNorm's running statistics) is an
output of a region that takes the buffer, and no other call reads either, the region can write
the buffer's memory (nvFuser: an output aliased to its input) and the write-back's copy is skipped
(``writeback.WriteBacks.in_place``). Read from the execution trace's Python source, once a compile."""

import ast
import collections
import dataclasses


def region_writes(trace, wb, forward: bool, executors) -> tuple:
    """``Region.writes`` by region name, for the execution ``trace`` whose write-backs are ``wb``
    (``forward``: it returns ``(outputs, residuals)``) and the regions of the ``executors`` that
    write inputs (``FusionExecutor.writes_inputs``), and ``wb`` with ``in_place`` the inputs they
    write (the others' copies stay). A buffer read by any other call, or returned, or read by two
    calls of its region, or a value read by any other call than the return, is left to the copies."""
    if wb is None or not wb.in_place:
        return {}, wb
    regions = {c.name: c for c in trace.regions() if getattr(executors[c.executor], "writes_inputs", False)}
    found = _found(trace, wb, forward, regions) if regions else {}
    given = {k for pairs in found.values() for _, k in pairs}
    written = tuple(k for k in wb.in_place if k in given)
    writes = {name: tuple(pair for pair, _ in pairs) for name, pairs in found.items()}
    return writes, dataclasses.replace(wb, in_place=written)


def _found(trace, wb, forward: bool, regions: dict) -> dict:
    """Per region name, ``((output, input), trace input index)`` of the writes it may make."""
    function = ast.parse(str(trace)).body[-1]
    if not isinstance(function, ast.FunctionDef):
        return {}
    params = [a.arg for a in function.args.args]
    loads = collections.Counter(
        n.id for n in ast.walk(function) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)
    )
    calls = {}  # value name -> (region code, output position, argument names)
    for stmt in function.body:
        if isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Call):
            callee = stmt.value.func
            if isinstance(callee, ast.Name) and callee.id in regions:
                target = stmt.targets[0]
                outs = target.elts if isinstance(target, ast.Tuple) else [target]
                args = [a.id if isinstance(a, ast.Name) else None for a in stmt.value.args]
                for i, o in enumerate(outs):
                    if isinstance(o, ast.Name):
                        calls[o.id] = (regions[callee.id], i, args)
    outputs = _returned(function, forward)
    found: dict = {}
    for k, j, grad in wb.copies:
        if grad or k not in wb.in_place or j >= len(outputs) or not isinstance(outputs[j], ast.Name):
            continue
        value, buffer = outputs[j].id, params[k]
        # (read once each: the buffer by the call computing the value, the value by the return)
        if value not in calls or loads[buffer] != 1 or loads[value] != 1:
            continue
        code, at, args = calls[value]
        if args.count(buffer) != 1:
            continue
        inner = code.inputs[args.index(buffer)]
        # (read by one call of the region: no segment nvFuser makes of it reads it after the write)
        if sum(_names(c.args).count(inner) for c in code.calls) == 1:
            found.setdefault(code.name, []).append(((code.outputs[at], inner), k))
    return found


def _returned(function: ast.FunctionDef, forward: bool) -> list:
    """The flat outputs' nodes of the function's return (none where it is not a tuple of them)."""
    last = function.body[-1]
    returned = last.value if isinstance(last, ast.Return) else None
    if forward and isinstance(returned, ast.Tuple) and returned.elts:
        returned = returned.elts[0]
    return returned.elts if isinstance(returned, ast.Tuple) else []


def _names(args) -> list:
    """The value names among a call's arguments (nested in lists for ``cat``)."""
    found = []
    for a in args:
        if isinstance(a, str):
            found.append(a)
        elif isinstance(a, (tuple, list)):
            found.extend(_names(a))
    return found
