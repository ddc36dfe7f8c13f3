"""What the compile-worker test files share: starting workers and waiting until they are ready."""

from __future__ import annotations

import time

from eqsat.backend import compile_workers


def start_ready(count: int) -> None:
    """Start `count` workers and wait until they take requests."""
    compile_workers.start(count)
    deadline = time.monotonic() + 60
    while not all(w.usable() for w in compile_workers._workers):
        assert time.monotonic() < deadline, "compile workers did not start"
        time.sleep(0.01)
