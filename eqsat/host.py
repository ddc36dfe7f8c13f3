"""What this process may use of the machine it runs on, for every layer that sizes work by it."""

from __future__ import annotations

import os

MAX_THREADS = 16  # the CPU backend's pool never starts more threads than this


def usable_cores() -> int:
    """The cores this process may run on, at most MAX_THREADS: its CPU affinity, which a
    container or `taskset` narrows below os.cpu_count() (threads beyond it only take turns)."""
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = os.cpu_count() or 1
    return max(1, min(n, MAX_THREADS))
