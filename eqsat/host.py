"""What this process may use of the machine it runs on, for every layer that sizes work by it."""

from __future__ import annotations

import os

MAX_THREADS = 16  # the CPU backend's pool never starts more threads than this
# Bytes plus simple operations (the op table's element_cost) below which a CPU kernel runs on
# the calling thread alone: waking a sleeping worker takes ~10-30 us. The cost model prices
# such kernels at one core's rate. Measured with back-to-back calls (2 threads; single /
# threaded): an add of 64k floats (0.85M) 11.7 / 12.4 us, exp of 64k (1.5M) 18.4 / 14.9,
# 64x784 @ 784x10 (1.7M) 20.9 / 17.0, 256k adds (3.4M) 31 / 23; the demo's training step
# 68 -> 44 us, larger workloads unchanged.
PARALLEL_MIN_WORK = 1 << 20


def usable_cores() -> int:
    """The cores this process may run on, at most MAX_THREADS: its CPU affinity, which a
    container or `taskset` narrows below os.cpu_count() (threads beyond it only take turns)."""
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = os.cpu_count() or 1
    return max(1, min(n, MAX_THREADS))
