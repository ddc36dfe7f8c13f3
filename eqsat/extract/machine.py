"""This machine's floating-point rate and memory bandwidths, measured once and cached.

The roofline model of the `cpu` target needs a peak rate, the bandwidth of main memory, and the
bandwidth of data that stays in the last-level cache. A short numpy micro-benchmark (well under a
second: a BLAS matrix product and array copies, best of a few runs) measures them on first use;
the result lives in a JSON file in the user's cache directory (`$EQSAT_CACHE_DIR`, else
`$XDG_CACHE_HOME/eqsat`, else `~/.cache/eqsat`) and is measured again only when the machine or
numpy changes, or when asked to.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from ..cache import CACHE_ENV, cache_dir, machine_key, store  # noqa: F401  (re-exported)
from ..host import usable_cores

CACHE_FILE = "machine.json"

# Sizes chosen so that the whole benchmark stays well under a second on a slow laptop. The
# copy's arrays are each at least twice the last-level cache: at 32 MiB each (a 32 MiB L3
# here) the best copy found part of them in the cache, and measured 30 to 44 GB/s from one
# process start to the next, enough to change the programs extraction picks (a GRU cell's
# gradient, 10% apart); at 64 MiB it measured 32-33.
_MATMUL_N = 512
_SMALL_SHAPE = (96, 48, 48)
_COPY_BYTES = 32 * 2**20
# ... but not more than this: a virtual machine here reports a 480 MiB L3 (the socket's), and
# copies of 4x half of it, 960 MiB each, made the first compile on an empty cache take 6.3 s
# (2.5 s of it faulting the pages in) to measure 23.3 GB/s, as a 128 MiB copy does. Where the
# cache is that large, nearly every kernel's bytes count as cached anyway.
_COPY_MAX_BYTES = 128 * 2**20
# The last-level cache where sysfs does not say (bytes); a kernel whose bytes fit in half of it
# finds its operands there when the kernel before it wrote them.
_DEFAULT_LLC = 16 * 2**20
_REPEATS = 4
# Each rate is the best of as many runs as fit in this many seconds (at least _REPEATS): the
# rates are kept for good, and a product of ~1 ms measured 4 times could land entirely in a
# burst of another process's work (measured here: 13 GFLOP/s once against 200 the next time).
_BUDGET_S = 0.1


@dataclass(frozen=True)
class CpuRates:
    """Measured peak GFLOP/s (fp32 matrix product) and bandwidths (GB/s) of this machine: of
    main memory, and of working sets up to `cache_bytes` (half the last-level cache)."""

    gflops: float
    bandwidth_gbs: float
    key: str = ""
    cache_bandwidth_gbs: float = 0.0
    cache_bytes: int = 0


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

    cache_bytes = last_level_cache() // 2
    src, dst = _copy_buffers(min(max(_COPY_BYTES, 4 * cache_bytes), _COPY_MAX_BYTES))
    bandwidth = _copy_rate(src, dst)
    # never below main memory's: a busy neighbour during the short cached copy must not make
    # cache-resident data look dearer than data from memory
    cached_n = max(1, min(cache_bytes // 2, _COPY_BYTES) // src.itemsize)
    cached = max(bandwidth, _copy_rate(src[:cached_n], dst[:cached_n]))
    return CpuRates(gflops=gflops, bandwidth_gbs=bandwidth, key=machine_key(),
                    cache_bandwidth_gbs=cached, cache_bytes=cache_bytes)


def _copy_buffers(nbytes: int) -> tuple[np.ndarray, np.ndarray]:
    """A source and a destination of `nbytes` each, every page touched (an untouched source
    would read the shared zero page, from the cache)."""
    src = np.ones(max(1, nbytes // 4), dtype=np.float32)
    dst = np.empty_like(src)
    np.copyto(dst, src)
    return src, dst


def _copy_rate(src: np.ndarray, dst: np.ndarray) -> float:
    """GB/s of a numpy copy of `src` into `dst` (read plus written bytes over the time)."""
    return 2 * src.nbytes / _best_seconds(lambda: np.copyto(dst, src), _REPEATS) / 1e9


def last_level_cache(sysfs: Path = Path("/sys/devices/system/cpu/cpu0/cache")) -> int:
    """Bytes of the largest cache sysfs lists for CPU 0 (_DEFAULT_LLC where it lists none)."""
    sizes = []
    for index in sysfs.glob("index*"):
        try:
            text = (index / "size").read_text().strip().upper()
            unit = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:], 1)
            sizes.append(int(text.rstrip("KMG")) * unit)
        except (OSError, ValueError):
            continue
    return max(sizes, default=_DEFAULT_LLC)


def _read(path: Path, key: str) -> CpuRates | None:
    try:
        data = json.loads(path.read_text())
        rates = CpuRates(float(data["gflops"]), float(data["bandwidth_gbs"]), str(data["key"]),
                         float(data["cache_bandwidth_gbs"]), int(data["cache_bytes"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None  # missing or damaged cache: measure again
    if rates.key != key or not (rates.gflops > 0 and rates.bandwidth_gbs > 0
                                and rates.cache_bandwidth_gbs > 0 and rates.cache_bytes >= 0):
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
    # atomic, so concurrent processes never read half a file (and a failed write leaves none)
    store(path.parent, path.name, json.dumps(asdict(rates), indent=1).encode())
    return rates
