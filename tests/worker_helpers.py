"""What the compile-worker test files share: starting workers and waiting until they are ready,
checking what they compiled."""

from __future__ import annotations

import time

import numpy as np

import eqsat
from eqsat.backend import compile_workers, cpu, jit
from eqsat.ir.samples import random_arguments

from cpu_helpers import assert_matches


def start_ready(count: int) -> None:
    """Start `count` workers and wait until they take requests."""
    compile_workers.start(count)
    deadline = time.monotonic() + 60
    while not all(w.usable() for w in compile_workers._workers):
        assert time.monotonic() < deadline, "compile workers did not start"
        time.sleep(0.01)


def check_runs(m: eqsat.Module, blob: bytes) -> None:
    """The object code `blob` of `m` computes what the interpreter does."""
    text, plans = cpu.lower(m)
    exe = cpu.Executable(m, jit.Code(blob), cpu._layout(plans), "test", None)
    rng = np.random.default_rng(0)
    for f in m.functions:
        args = random_arguments(f, -1.0, 1.0, rng)
        assert_matches(exe(f.name, *args), eqsat.interpret(m, f.name, *args), ulps=64,
                       atol=1e-5)
