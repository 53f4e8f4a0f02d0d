"""Markers for device-specific tests, so that the default suite runs on a CPU-only machine."""

import pytest
import torch

MARKERS = {
    "requires_cuda": "needs a CUDA device; skipped when none is available",
    "gpu": "runs on a GPU; skipped when no CUDA device is available (deselect with -m 'not gpu')",
}


def pytest_configure(config: pytest.Config) -> None:
    registered = {line.split(":")[0] for line in config.getini("markers")}
    for name, help_text in MARKERS.items():
        if name not in registered:
            config.addinivalue_line("markers", f"{name}: {help_text}")


def pytest_runtest_setup(item: pytest.Item) -> None:
    if any(item.get_closest_marker(name) for name in MARKERS) and not torch.cuda.is_available():
        pytest.skip("CUDA is not available")
