"""Markers for device-specific and slow tests, so that the default suite runs on a CPU-only machine
in a short time. Slow tests (over ~20 s on a 2-core machine) run with ``--run-slow``. Under
pytest-xdist (``make test-python``) each worker takes its share of the cores."""

import os

import pytest
import torch

MARKERS = {
    "requires_cuda": "needs a CUDA device; skipped when none is available",
    "gpu": "runs on a GPU; skipped when no CUDA device is available (deselect with -m 'not gpu')",
}
SLOW = "slow"
SLOW_HELP = "takes over ~20 s on a 2-core machine; skipped unless --run-slow is given"
# pytest-xdist registers it; without xdist the tests it groups run in one process anyway.
XDIST_GROUP_HELP = "xdist_group(name): tests of one group run in the same xdist worker under --dist loadgroup"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--run-slow", action="store_true", default=False, help="run tests marked slow")


def pytest_configure(config: pytest.Config) -> None:
    registered = {line.split(":")[0] for line in config.getini("markers")}
    for name, help_text in MARKERS.items():
        if name not in registered:
            config.addinivalue_line("markers", f"{name}: {help_text}")
    if SLOW not in registered:
        config.addinivalue_line("markers", f"{SLOW}: {SLOW_HELP}")
    if not config.pluginmanager.hasplugin("xdist"):
        config.addinivalue_line("markers", XDIST_GROUP_HELP)
    share_cores_between_workers()


def share_cores_between_workers() -> None:
    """In an xdist worker, torch's intra-op threads are the worker's share of the cores: every
    worker running torch's default (one thread per core) would oversubscribe them."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        torch.set_num_threads(max(1, torch.get_num_threads() // workers))


def pytest_runtest_setup(item: pytest.Item) -> None:
    if any(item.get_closest_marker(name) for name in MARKERS) and not torch.cuda.is_available():
        pytest.skip("CUDA is not available")
    if item.get_closest_marker(SLOW) and not item.config.getoption("--run-slow"):
        pytest.skip("slow: run with --run-slow")


@pytest.fixture
def one_thread():
    """Runs a test on one thread, so that eager and compiled calls reduce in the same order, and
    restores the thread count after."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def fake_ex(monkeypatch):
    """An nvFuser executor on the stand-in module (``fake_nvfuser_direct``), allowed CPU tensors;
    the stand-in is also what ``import nvfuser_direct`` finds."""
    import sys  # noqa: PLC0415 (the nvFuser tests' fixtures: imported where used)

    import fake_nvfuser_direct as fake  # noqa: PLC0415
    from thunder_rs.executors.nvfuser_ex import NvFuserExecutor  # noqa: PLC0415

    monkeypatch.setitem(sys.modules, "nvfuser_direct", fake)
    fake.definitions.clear()
    return NvFuserExecutor("nvfuser_fake", module=fake, allow_cpu=True)


@pytest.fixture
def real_nvfuser():
    """The installed ``nvfuser_direct``; the test is skipped where it does not import."""
    from thunder_rs.executors import nvfuser_ex  # noqa: PLC0415

    try:
        return nvfuser_ex.import_nvfuser_direct()
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"nvfuser_direct does not import: {type(e).__name__}: {e}")


@pytest.fixture
def fake_cuda(monkeypatch):
    """A fake CUDA runtime of two devices (``fake_cuda_runtime``), under ``FakeTensorMode``: what the
    program sets, waits for and asks of CUDA, without a GPU."""
    import fake_cuda_runtime  # noqa: PLC0415 (the CUDA tests' fixtures: imported where used)
    from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: PLC0415

    runtime = fake_cuda_runtime.install(monkeypatch)
    with FakeTensorMode(allow_non_fake_inputs=True):
        yield runtime
