"""This machine's floating-point rate and memory bandwidth, measured once and cached.

The roofline model of the `cpu` target needs two numbers. A short numpy micro-benchmark
(well under a second: a BLAS matrix product and a large array copy, best of a few runs) measures
them on first use; the result lives in a JSON file in the user's cache directory
(`$EQSAT_CACHE_DIR`, else `$XDG_CACHE_HOME/eqsat`, else `~/.cache/eqsat`) and is measured again
only when the machine or numpy changes, or when asked to.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from ..cache import CACHE_ENV, cache_dir, machine_key  # noqa: F401  (re-exported)
from ..host import usable_cores

CACHE_FILE = "machine.json"

# Sizes chosen so that the whole benchmark stays well under a second on a slow laptop while
# the copy (32 MiB read + 32 MiB written) still spills out of a typical last-level cache.
_MATMUL_N = 512
_SMALL_SHAPE = (96, 48, 48)
_COPY_BYTES = 32 * 2**20
_REPEATS = 4
# Each rate is the best of as many runs as fit in this many seconds (at least _REPEATS): the
# rates are kept for good, and a product of ~1 ms measured 4 times could land entirely in a
# burst of another process's work (measured here: 13 GFLOP/s once against 200 the next time).
_BUDGET_S = 0.1


@dataclass(frozen=True)
class CpuRates:
    """Measured peak GFLOP/s (fp32 matrix product) and memory bandwidth (GB/s) of this machine."""

    gflops: float
    bandwidth_gbs: float
    key: str = ""


def _best_seconds(fn, repeats: int, budget: float = _BUDGET_S) -> float:
    best, runs, start = float("inf"), 0, time.perf_counter()
    while runs < repeats or time.perf_counter() - start < budget:
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
        runs += 1
    return max(best, 1e-9)


def measure() -> CpuRates:
    """Run the micro-benchmark now (a fraction of a second) and return its rates.

    The peak is the larger of a big product on the BLAS's threads and small single-threaded
    products times the cores: with another process busy on one core, the threaded product
    waits on its slowed thread every time (measured here: 12 against 200 GFLOP/s), while one
    core's small products still find their core free between bursts."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((_MATMUL_N, _MATMUL_N), dtype=np.float32)
    b = rng.standard_normal((_MATMUL_N, _MATMUL_N), dtype=np.float32)
    out = np.empty_like(a)
    np.matmul(a, b, out=out)  # warm up BLAS threads and pages
    mm = _best_seconds(lambda: np.matmul(a, b, out=out), _REPEATS)
    # a stack of products too small for the BLAS to thread (OpenBLAS: under 2^18 multiply-adds)
    sa = rng.standard_normal(_SMALL_SHAPE, dtype=np.float32)
    sb = rng.standard_normal(_SMALL_SHAPE, dtype=np.float32)
    sout = np.empty_like(sa)
    np.matmul(sa, sb, out=sout)
    small = _best_seconds(lambda: np.matmul(sa, sb, out=sout), _REPEATS)
    batch, n = _SMALL_SHAPE[0], _SMALL_SHAPE[1]
    gflops = max(2 * _MATMUL_N**3 / mm, 2 * batch * n**3 / small * usable_cores()) / 1e9

    src = np.ones(_COPY_BYTES // 4, dtype=np.float32)
    dst = np.empty_like(src)
    np.copyto(dst, src)  # touch the destination pages before timing
    cp = _best_seconds(lambda: np.copyto(dst, src), _REPEATS)
    bandwidth = 2 * _COPY_BYTES / cp / 1e9
    return CpuRates(gflops=gflops, bandwidth_gbs=bandwidth, key=machine_key())


def _read(path: Path, key: str) -> CpuRates | None:
    try:
        data = json.loads(path.read_text())
        rates = CpuRates(float(data["gflops"]), float(data["bandwidth_gbs"]), str(data["key"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None  # missing or damaged cache: measure again
    if rates.key != key or not (rates.gflops > 0 and rates.bandwidth_gbs > 0):
        return None
    return rates


def cpu_rates(cache: str | os.PathLike | None = None, refresh: bool = False) -> CpuRates:
    """This machine's rates: from the cache file when it matches this machine, else measured.

    `cache` overrides the cache directory; `refresh=True` measures again. A cache directory
    that cannot be written is not an error: the measurement is used and not kept.
    """
    path = cache_dir(cache) / CACHE_FILE
    key = machine_key()
    if not refresh:
        found = _read(path, key)
        if found is not None:
            return found
    rates = measure()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(asdict(rates), indent=1))
        os.replace(tmp, path)  # atomic, so concurrent processes never read half a file
    except OSError:
        pass
    return rates
