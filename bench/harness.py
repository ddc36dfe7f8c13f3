"""Timing and compiling for the benchmarks: interleaved medians in one process, compile time
cold and from the disk cache (each in a fresh subprocess), and the optional peers."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

import eqsat
from eqsat.ad import differentiate
from eqsat.backend import compile_module

BENCH = Path(__file__).resolve().parent


def prepare(module: eqsat.Module, optimize: bool) -> eqsat.Module:
    """Gradient declarations expanded, then (if asked) the optimizer run."""
    module = differentiate(module) if module.grad_decls else module
    return eqsat.optimize(module) if optimize else module


SETTLE_S = 0.15


def interleaved_medians(fns: dict[str, Callable[[], Any]], seconds: float, rounds: int = 8
                        ) -> tuple[dict[str, float], dict[str, float]]:
    """Median wall seconds and median process CPU seconds (all threads) per call of each
    function, run in `rounds` rounds of rotating order (so a burst of load from other
    processes hits every contestant alike), each contestant calling its function for an equal
    slice of `seconds` per round. Before each slice the process sleeps `SETTLE_S`, so that
    the previous contestant's thread pools (OpenBLAS, OpenMP, XLA: they spin for up to ~0.1 s
    after their last task) have gone idle, and the first call of the slice is not counted
    (the previous contestant's data has just evicted this one's from the caches)."""
    for f in fns.values():  # warm up: page faults, caches, lazy initialisation
        f()
    wall: dict[str, list[float]] = {k: [] for k in fns}
    cpu: dict[str, list[float]] = {k: [] for k in fns}
    names = list(fns)
    slice_s = seconds / (rounds * len(names))
    for rnd in range(rounds):
        for name in names[rnd % len(names):] + names[: rnd % len(names)]:
            time.sleep(SETTLE_S)
            f, calls, start = fns[name], 0, time.perf_counter()
            while calls < 3 or time.perf_counter() - start < slice_s:
                c0, t0 = time.process_time(), time.perf_counter()
                f()
                if calls:
                    wall[name].append(time.perf_counter() - t0)
                    cpu[name].append(time.process_time() - c0)
                calls += 1
    return ({k: float(np.median(v)) for k, v in wall.items()},
            {k: float(np.median(v)) for k, v in cpu.items()})


def median_seconds(f: Callable[[], Any], budget: float = 0.3, min_runs: int = 5) -> float:
    """Median seconds of `f()` over `budget` seconds of calls (at least `min_runs`), after one
    call to warm it up: one function alone, where no peer needs interleaving."""
    f()
    ts: list[float] = []
    start = time.perf_counter()
    while len(ts) < min_runs or time.perf_counter() - start < budget:
        t0 = time.perf_counter()
        f()
        ts.append(time.perf_counter() - t0)
    return float(np.median(ts))


def first_call_seconds(f: Callable[[], Any]) -> float:
    """Seconds of the first call of `f` (a peer's tracing and compiling)."""
    t0 = time.perf_counter()
    f()
    return time.perf_counter() - t0


_COMPILE_SCRIPT = """
import json, sys, time
sys.path.insert(0, {bench!r})
import workloads
import eqsat
w = next(w for w in workloads.WORKLOADS if w.name == {name!r})
m = w.modules[{variant!r}]()
t0 = time.perf_counter()
eqsat.compile(m, optimize={optimize!r})
print(json.dumps(time.perf_counter() - t0))
"""


def compile_times(name: str, variant: str, optimize: bool) -> tuple[float, float, float]:
    """Seconds of `eqsat.compile` (differentiate, optimize if asked, lower), each in a fresh
    process, imports not counted (its lazy ones are, from bytecode): on first use (an empty
    cache directory: the one-time measurement of the machine's rates included), cold (the
    program never compiled, what is not the program's own left in the cache) and from the disk
    cache."""
    with tempfile.TemporaryDirectory() as cache:
        out = []
        for run in range(3):
            if run == 1:  # forget the program, keep the machine's rates and the runtimes
                shutil.rmtree(Path(cache, "optimized"), ignore_errors=True)
                for f in Path(cache, "objects").glob("*"):
                    if not f.name.startswith("runtime-"):
                        f.unlink()
            script = _COMPILE_SCRIPT.format(bench=str(BENCH), name=name, variant=variant,
                                            optimize=optimize)
            # Modules imported lazily inside compile count, from bytecode as for any user: a
            # PYTHONDONTWRITEBYTECODE in this environment would have each run recompile them
            # from source (~0.08 s).
            env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
            res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                                 env={**env, "PYTHONHASHSEED": "0", "EQSAT_CACHE_DIR": cache},
                                 check=True)
            out.append(json.loads(res.stdout.strip().splitlines()[-1]))
    return out[0], out[1], out[2]


def compile_here(module: eqsat.Module) -> eqsat.backend.Executable:
    """Compile in this process without touching the user's disk cache."""
    return compile_module(module, cache_dir=None)


def peers() -> dict[str, Any]:
    """The installed peers: 'jax' -> (jax, jax.numpy), 'torch' -> torch."""
    found: dict[str, Any] = {}
    try:
        import jax
        import jax.numpy as jnp
        found["jax"] = (jax, jnp)
    except ImportError:
        pass
    try:
        import torch
        found["torch"] = torch
    except ImportError:
        pass
    return found


def max_rel_error(got: Any, want: Any) -> float:
    """The largest |got - want| / (|want| + 1e-3) over all results (a sanity check only)."""
    got = got if isinstance(got, tuple) else (got,)
    want = want if isinstance(want, tuple) else (want,)
    worst = 0.0
    for g, w in zip(got, want):
        g, w = np.asarray(g, np.float64), np.asarray(w, np.float64)
        worst = max(worst, float(np.max(np.abs(g - w) / (np.abs(w) + 1e-3), initial=0.0)))
    return worst


def load_average() -> str:
    """The 1/5/15-minute load averages, as uptime prints them."""
    return " ".join(f"{x:.2f}" for x in os.getloadavg())
