"""The CPU backend's settings from the environment, in a module light enough for the cached
compile path (which must not import the kernel builders to learn them)."""

from __future__ import annotations

import os

from ..errors import Error
from ..host import MAX_THREADS, usable_cores


def gemm_switches() -> tuple[bool, bool]:
    """From EQSAT_GEMM: whether the generated GEMM takes float products at all, and lone
    (unbatched) ones too: "all" (the default), "batched" (lone products on the BLAS), "0"
    (every product on the BLAS); anything else is an eqsat.Error (a typo such as "off" or
    "blas" silently meant "all"). Every CPU compile reads it for its cache key."""
    mode = os.environ.get("EQSAT_GEMM", "").strip() or "all"
    if mode not in ("all", "batched", "0"):
        raise Error(f"EQSAT_GEMM must be 'all' (the default), 'batched' (lone products on the "
                    f"BLAS) or '0' (every product on the BLAS), not {mode!r}")
    return mode != "0", mode == "all"


def default_threads() -> int:
    """How many threads kernels are split over: the cores this process may use, at most 16."""
    return usable_cores()


def requested_compile_workers() -> int | None:
    """EQSAT_COMPILE_WORKERS as a count of worker processes (0: none), None where unset;
    eqsat.Error where it is not a plain number. More than MAX_THREADS are never asked for:
    they would compile nothing sooner, and a typo of many digits started processes until the
    system refused one. Every CPU compile calls this (a microsecond), so a typo shows at the
    first compile, not only at one that optimizes a program anew."""
    value = os.environ.get("EQSAT_COMPILE_WORKERS", "").strip()
    if not value:
        return None
    if not (value.isascii() and value.isdigit()):
        raise Error(f"EQSAT_COMPILE_WORKERS must be a number of worker processes (0: none), "
                    f"not {value!r}")
    return min(int(value), MAX_THREADS)


def compile_workers() -> int:
    """How many worker processes compile parts of a program's LLVM IR in parallel (0: none):
    EQSAT_COMPILE_WORKERS where set, else one less than the usable cores, at most 3, and only
    as many as the load average leaves idle: on 2 cores busy with another process, a worker
    only took time from the optimizer (training step cold: 1.16-1.39 s with one, 0.91-1.10
    without, at load 2)."""
    requested = requested_compile_workers()
    if requested is not None:
        return requested
    cores = usable_cores()
    try:
        idle = int(cores - os.getloadavg()[0] + 0.5)
    except (AttributeError, OSError):  # no load average here
        idle = cores
    return max(0, min(3, cores - 1, idle))
