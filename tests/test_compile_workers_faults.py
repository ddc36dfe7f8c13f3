"""Compile workers (backend/compile_workers.py) under faults: a compile interrupted or stopped
while a worker has a part, workers that die or misbehave, processes and pipes left behind,
threads and forked or spawned processes compiling at once. Whatever happens, a program
compiles to what the interpreter computes, and nothing is printed."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest

import eqsat
from eqsat.backend import compile_workers, cpu, jit
from eqsat.ir.samples import random_arguments

from cpu_helpers import assert_matches

EXAMPLES = Path(eqsat.__file__).parent / "examples"


def _program(name: str = "mlp.eqir") -> eqsat.Module:
    return eqsat.differentiate(eqsat.parse((EXAMPLES / name).read_text()))


def _start(count: int) -> None:
    """Start `count` workers and wait until they take requests."""
    compile_workers.start(count)
    deadline = time.monotonic() + 60
    while not all(w.usable() for w in compile_workers._workers):
        assert time.monotonic() < deadline, "compile workers did not start"
        time.sleep(0.01)


@pytest.fixture
def workers(monkeypatch):
    """`workers(n)`: n compile workers running, every module large enough to split; stopped
    afterwards. Exceptions that end a thread are collected in the list it yields."""
    monkeypatch.setattr(compile_workers, "MIN_LINES", 0)
    errors: list[BaseException] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: errors.append(args.exc_value))

    def run(count: int) -> list[BaseException]:
        compile_workers.stop()
        _start(count)
        return errors
    yield run
    compile_workers.stop()


def _check_runs(m: eqsat.Module, blob: bytes) -> None:
    """The object code `blob` of `m` computes what the interpreter does."""
    text, plans = cpu.lower(m)
    exe = cpu.Executable(m, jit.Code(blob), cpu._layout(plans), "test", None)
    rng = np.random.default_rng(0)
    for f in m.functions:
        args = random_arguments(f, -1.0, 1.0, rng)
        assert_matches(exe(f.name, *args), eqsat.interpret(m, f.name, *args), ulps=64,
                       atol=1e-5)


def test_stopping_workers_while_one_has_a_part(workers, monkeypatch):
    """stop() while a worker compiles a part (the interpreter's exit does, under a daemon
    thread's compile): the thread waiting for its reply ends quietly (it raised ValueError:
    I/O operation on closed file), the part is compiled here, and the worker leaves neither
    process nor pipe behind."""
    errors = workers(1)
    worker = compile_workers._workers[0]
    real = jit.compile_object

    def local(text: str) -> bytes:  # this process's own part: the worker has its own now
        compile_workers.stop()
        return real(text)

    monkeypatch.setattr(jit, "compile_object", local)
    m = _program()
    blob = compile_workers.compile_objects(cpu.lower(m)[0])
    monkeypatch.setattr(jit, "compile_object", real)
    assert errors == []
    assert worker.proc.returncode is not None
    assert worker.proc.stdin.closed and worker.proc.stdout.closed
    _check_runs(m, blob)
