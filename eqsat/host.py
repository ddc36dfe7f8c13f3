"""What this process may use of the machine it runs on, for every layer that sizes work by it."""

from __future__ import annotations

import math
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


# A reduction whose outermost axis (of length > 1) is reduced, a column sum or a full sum, is cut
# by the CPU backend into this many parts along that axis: each part's rows are reduced into a
# partial result by a kernel the threads split (walking rows in memory order), then the partials
# are combined in order (backend/reductions.py). A fixed count, not the cores: results do not
# depend on the machine. Only where the domain has at least SPLIT_MIN_ELEMENTS elements (below,
# the kernel runs on one thread anyway and the extra combine would only cost).
REDUCTION_PARTS = 8
SPLIT_MIN_ELEMENTS = 1 << 16


def split_axis(domain: tuple[int, ...] | list[int], axes: set[int] | tuple[int, ...]
               ) -> int | None:
    """The axis of a reduction's `domain` that the CPU backend cuts into REDUCTION_PARTS parts
    (see there), or None where it runs the reduction as one kernel."""
    first = next((d for d, n in enumerate(domain) if n != 1), None)
    if first is None or first not in axes:
        return None
    n = domain[first]
    if n % REDUCTION_PARTS or n < 2 * REDUCTION_PARTS or math.prod(domain) < SPLIT_MIN_ELEMENTS:
        return None
    return first
