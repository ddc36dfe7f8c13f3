"""Compile workers against the rest of the process: forks from other threads, and workers
that stop answering. Whatever happens, a compile ends and nothing waits for good."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import eqsat
from eqsat.backend import compile_workers, cpu, jit

from worker_helpers import check_runs, start_ready


def test_a_fork_while_a_worker_starts_keeps_no_end_of_its_pipes(monkeypatch):
    """Another thread forks (a multiprocessing pool) while start() makes a worker: the child
    kept a copy of the end the worker replies on, which the child's after-fork cleanup did
    not know of yet (the worker was not in the pool), so a worker that died then never read
    as ended here while the child lived, and a compile waiting for its reply waited that
    long. A fork now waits until start() is done."""
    real = subprocess.Popen
    hold_r, hold_w = os.pipe()
    forked = threading.Event()
    pids: list[int] = []

    def fork() -> None:
        pid = os.fork()
        if pid == 0:  # the child: lives until the test lets it go
            os.close(hold_w)
            os.read(hold_r, 1)
            os._exit(0)
        pids.append(pid)
        forked.set()

    def popen(*args, **kwargs):
        threading.Thread(target=fork).start()
        forked.wait(timeout=1)  # a fork that can happen now does so, mid-start
        return real(*args, **kwargs)

    compile_workers.stop()
    monkeypatch.setattr(subprocess, "Popen", popen)
    try:
        compile_workers.start(1)
        monkeypatch.setattr(subprocess, "Popen", real)
        worker = compile_workers._workers[0]
        deadline = time.monotonic() + 60
        while not worker.usable():
            assert worker.alive() and time.monotonic() < deadline, "the worker did not start"
            time.sleep(0.01)
        assert forked.wait(timeout=60)
        worker.proc.kill()
        worker.proc.wait()
        readable, _, _ = select.select([worker.replies], [], [], 10)
        assert readable and worker.replies.read(1) == b""
    finally:
        os.close(hold_w)
        for pid in pids:
            os.waitpid(pid, 0)
        os.close(hold_r)
        compile_workers.stop()


def test_a_worker_that_stops_answering_is_given_up(monkeypatch):
    """A worker stopped (SIGSTOP, a debugger, a machine swapping) while it has a part: the
    compile waited for its reply for good. It now waits a while past the time its own part
    took (here cut short), then ends the worker and compiles that part itself."""
    monkeypatch.setattr(compile_workers, "MIN_COST", 0)
    monkeypatch.setattr(compile_workers, "WAIT_S", 0.2)
    compile_workers.stop()
    try:
        start_ready(1)
        worker = compile_workers._workers[0]
        m = eqsat.differentiate(eqsat.parse((Path(eqsat.__file__).parent / "examples" /
                                                 "mlp.eqir").read_text()))
        text = cpu.lower(m)[0]
        os.kill(worker.proc.pid, signal.SIGSTOP)
        got: list[bytes] = []
        compiling = threading.Thread(target=lambda: got.append(
            compile_workers.compile_objects(text)), daemon=True)
        compiling.start()
        compiling.join(timeout=120)
        assert not compiling.is_alive(), "the compile waited for a stopped worker"
        assert len(jit.unpack_objects(got[0])) == 2 and not worker.alive()
        check_runs(m, got[0])
        start_ready(1)
        assert compile_workers._workers[0] is not worker
    finally:
        if worker.alive():
            os.kill(worker.proc.pid, signal.SIGCONT)
        compile_workers.stop()


FORK_SCRIPT = """
import gc, os, select, sys
from eqsat.backend import compile_workers
compile_workers.start(1)
select.select([compile_workers._workers[0].replies], [], [], 60)
pid = os.fork()
if pid == 0:
    gc.collect()
    sys.stderr.flush()
    os._exit(0)
os.waitpid(pid, 0)
"""


def test_a_forked_child_says_nothing_of_its_parents_workers():
    """A forked child drops its parent's workers from its pool: the process handles it let
    go of each warned (ResourceWarning, shown with -X dev or under a test runner) that a
    process it never waited for still ran, once per worker in every child of a pool."""
    out = subprocess.run([sys.executable, "-X", "dev", "-c", FORK_SCRIPT], capture_output=True,
                         text=True, timeout=120)
    assert (out.returncode, out.stderr) == (0, "")
