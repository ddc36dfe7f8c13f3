"""Compile workers and the source they run: a worker imports eqsat when it starts, which may
be later than this process did, so it must say which code it runs before it gets a part."""

from __future__ import annotations

import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import eqsat
from eqsat.backend import compile_workers, cpu, jit

EXAMPLES = Path(eqsat.__file__).parent / "examples"


@pytest.mark.parametrize("edited", [False, True])
def test_a_worker_running_other_eqsat_source_is_not_used(monkeypatch, tmp_path, edited):
    """Here workers import a copy of eqsat, edited or not since this process imported its
    own (as an editable install is). An edited one compiled with other code than this
    process's, and the objects were cached under this process's fingerprint of the code
    generator. A worker now tells its fingerprint when it is ready: one that differs is
    ended, none is started again, and this process compiles alone."""
    copy = tmp_path / "eqsat"
    shutil.copytree(Path(eqsat.__file__).parent, copy,
                    ignore=shutil.ignore_patterns("__pycache__"))
    if edited:
        with open(copy / "backend" / "jit.py", "a") as f:
            f.write("\n# edited after the parent imported it\n")
    monkeypatch.setattr(compile_workers._Worker, "COMMAND",
                        f"import sys; sys.path.insert(0, {str(tmp_path)!r}); "
                        + compile_workers._Worker.COMMAND)
    monkeypatch.setattr(compile_workers, "_broken", False)
    monkeypatch.setattr(compile_workers, "MIN_COST", 0)
    compile_workers.stop()
    try:
        compile_workers.start(1)
        worker = compile_workers._workers[0]
        deadline = time.monotonic() + 60
        while worker.alive() and not worker.usable():
            assert time.monotonic() < deadline, "the compile worker did not start"
            time.sleep(0.01)
        m = eqsat.differentiate(eqsat.parse((EXAMPLES / "mlp.eqir").read_text()))
        objects = jit.unpack_objects(compile_workers.compile_objects(cpu.lower(m)[0]))
        assert len(objects) == (1 if edited else 2)
        assert worker.alive() != edited
        compile_workers.start(1)
        assert len(compile_workers._workers) == (0 if edited else 1)
    finally:
        compile_workers.stop()


# A worker that writes the start of its hello, then waits for requests that never come.
HALF_HELLO = (
    "import os, sys\n"
    "from eqsat.backend.compile_workers import _hello\n"
    "os.write(int(sys.argv[1]), _hello()[:10])\n"
    "sys.stdin.buffer.read()\n")


def test_a_worker_that_stops_mid_hello_is_not_waited_for(monkeypatch):
    """Whether a worker is ready is asked under the pool's lock at every compile: it reads
    what the worker has written so far, never waiting for the rest of its hello."""
    monkeypatch.setattr(compile_workers._Worker, "COMMAND", HALF_HELLO)
    compile_workers.stop()
    try:
        compile_workers.start(1)
        worker = compile_workers._workers[0]
        deadline = time.monotonic() + 60
        with worker.busy:
            while not worker.said:
                assert worker.alive() and time.monotonic() < deadline
                assert not worker.usable()
                time.sleep(0.01)
            asked = threading.Thread(target=worker.usable, daemon=True)
            asked.start()
            asked.join(timeout=30)
            assert not asked.is_alive() and not worker.usable() and worker.alive()
    finally:
        compile_workers.stop()


EXIT_SCRIPT = """
import select
from eqsat.backend import compile_workers, jit
compile_workers.start(1)
select.select([compile_workers._workers[0].replies], [], [], 60)
def fingerprint():
    print("the code generator's fingerprint, at exit")
    return "0" * 64
jit.fingerprint = fingerprint
"""


def test_ending_workers_at_exit_reads_no_fingerprint():
    """stop() at the interpreter's exit asked each worker whether it was ready, which reads
    this process's fingerprint: where no compile had (workers started, then the optimizer
    raised), exit initialized LLVM and read the backend's source only to end the workers."""
    out = subprocess.run([sys.executable, "-c", EXIT_SCRIPT], capture_output=True, text=True,
                         timeout=120)
    assert (out.returncode, out.stdout, out.stderr) == (0, "", "")
