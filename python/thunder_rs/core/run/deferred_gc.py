"""The garbage collections a compile would start, run once at its end.

A compile allocates tens of thousands of objects that live until it ends (the proxies, the
recorder's values, the observer's guards and notes, the module clones), and every collection of
generation 0 it starts traverses all of them again: some 3 per compile of the tiny GPT-2's decode,
one of generation 1 every few, a few milliseconds in all, and for each the bystander snapshot of the
traced program's state (``core.state.collector``). While a compile runs, the threshold of
generation 0 is raised; at its end, where a collection would have been due, one collection of
generation 0 runs, over what the compile left alive.

Left as it was: collection disabled (``gc.disable()``, or a threshold of 0), a threshold higher
than ours, and a threshold the compiled program set while traced (it is not put back).
"""

import contextlib
import gc

#: The threshold of generation 0 while compiling (CPython's default is 700).
COMPILING_THRESHOLD = 100_000


@contextlib.contextmanager
def collections_deferred():
    """Defers the collections of generation 0 to the end of the block (nests: the outermost
    block collects)."""
    before = gc.get_threshold()
    if not gc.isenabled() or before[0] == 0 or before[0] >= COMPILING_THRESHOLD:
        yield
        return
    raised = (COMPILING_THRESHOLD, *before[1:])
    gc.set_threshold(*raised)
    try:
        yield
    finally:
        if gc.get_threshold() == raised:  # (unless the program set its own)
            gc.set_threshold(*before)
            if gc.isenabled() and gc.get_count()[0] > before[0]:
                gc.collect(0)
