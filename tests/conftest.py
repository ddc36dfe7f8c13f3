"""Suite-wide options: long fuzzing runs are opt-in with `pytest --run-slow`."""

from __future__ import annotations

import os

import pytest
from hypothesis import settings

# CI runs the same examples every time (a red CI run must be reproducible); a developer's
# run explores new ones.
settings.register_profile("default", deadline=None, derandomize=bool(os.environ.get("CI")))
settings.register_profile("slow", deadline=None, max_examples=2000)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--run-slow", action="store_true",
                     help="also run the long fuzzing tests marked slow")


def pytest_configure(config: pytest.Config) -> None:
    settings.load_profile("slow" if config.getoption("--run-slow") else "default")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--run-slow"):
        return
    skip = pytest.mark.skip(reason="long fuzzing run: use pytest --run-slow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def fresh(monkeypatch):
    """Compile without the in-memory cache; `threads(n, min_work)` sets the CPU backend's
    thread split (n threads for kernels of at least min_work)."""
    from eqsat.backend import cpu, parallel

    monkeypatch.setattr(cpu, "_memory", {})

    def threads(n: int, min_work: int) -> None:
        monkeypatch.setattr(parallel, "THREADS", n)
        monkeypatch.setattr(parallel, "PARALLEL_MIN_WORK", min_work)
    return threads
