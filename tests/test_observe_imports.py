"""The observer's hook keeps the module bodies running (``_core.CallObserver``): reads made while a
module is imported are not the program's, and once the import is over (returned or raised) the
program's reads are guarded again. Each test changes state read after an import between calls
and compares with eager."""

import torch

import thunder_rs

_LIBRARY = """
TABLE = {"scale": 2.0}


def lookup(name):
    return TABLE[name]
"""

_FAILING = """
STARTED = True
raise ImportError("this module does not import")
"""


def test_reads_after_a_lazy_import_are_guarded(tmp_path, monkeypatch):
    name = f"observed_library_{tmp_path.name}"
    (tmp_path / f"{name}.py").write_text(_LIBRARY)
    monkeypatch.syspath_prepend(str(tmp_path))

    def f(x):
        library = __import__(name)  # the first call imports it
        return x * library.lookup("scale")

    jf = thunder_rs.jit(f)
    x = torch.ones(3)
    torch.testing.assert_close(jf(x), f(x))
    __import__(name).TABLE["scale"] = 5.0  # read by lookup, after the import returned
    torch.testing.assert_close(jf(x), f(x))
    assert thunder_rs.compile_stats(jf).cache_misses == 2


SCALE = 2.0


def test_reads_after_an_import_that_raised_are_guarded(tmp_path, monkeypatch):
    global SCALE
    name = f"failing_library_{tmp_path.name}"
    (tmp_path / f"{name}.py").write_text(_FAILING)
    monkeypatch.syspath_prepend(str(tmp_path))

    def f(x):
        try:
            __import__(name)
        except ImportError:
            pass
        return x * SCALE

    jf = thunder_rs.jit(f)
    x = torch.ones(3)
    try:
        torch.testing.assert_close(jf(x), f(x))
        SCALE = 3.0
        torch.testing.assert_close(jf(x), f(x))
        assert thunder_rs.compile_stats(jf).cache_misses == 2
    finally:
        SCALE = 2.0
