"""Compile workers (backend/compile_workers.py) under faults: a compile interrupted or stopped
while a worker has a part, workers that die or misbehave, processes and pipes left behind,
threads and forked or spawned processes compiling at once. Whatever happens, a program
compiles to what the interpreter computes, and nothing is printed."""

from __future__ import annotations

import gc
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import eqsat
from eqsat.backend import compile_workers, cpu, jit

from worker_helpers import check_runs, start_ready

EXAMPLES = Path(eqsat.__file__).parent / "examples"


def _program(name: str = "mlp.eqir") -> eqsat.Module:
    return eqsat.differentiate(eqsat.parse((EXAMPLES / name).read_text()))


@pytest.fixture
def workers(monkeypatch):
    """`workers(n)`: n compile workers running, every module large enough to split; stopped
    afterwards. Exceptions that end a thread are collected in the list it yields."""
    monkeypatch.setattr(compile_workers, "MIN_COST", 0)
    errors: list[BaseException] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: errors.append(args.exc_value))

    def run(count: int) -> list[BaseException]:
        compile_workers.stop()
        start_ready(count)
        return errors
    yield run
    compile_workers.stop()


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
    assert worker.proc.stdin.closed and worker.replies.closed
    check_runs(m, blob)


EXIT_SCRIPT = """
import sys, threading, time
import eqsat
from eqsat.backend import compile_module, compile_workers, jit
compile_workers.MIN_COST = 0
compile_workers.start(1)
while not all(w.usable() for w in compile_workers._workers):
    time.sleep(0.01)
m = eqsat.differentiate(eqsat.parse(open(sys.argv[1]).read()))
started = threading.Event()
real, calls = jit.run_passes, []
def run_passes(pm, mod, pb):
    calls.append(1)
    if len(calls) == 2:  # the pipeline, after function merging: the longest call into LLVM
        started.set()
    return real(pm, mod, pb)
jit.run_passes = run_passes
threading.Thread(target=compile_module, args=(m,), kwargs={"cache_dir": None},
                 daemon=True).start()
started.wait()
"""


def test_the_interpreter_exits_while_a_daemon_thread_compiles_with_workers():
    """A daemon thread compiling (its own part in LLVM, another part in a worker) when the
    main thread ends: the process exits cleanly and says nothing. Exit tore down LLVM's global
    state under the thread's pass pipeline (a segfault, or an LLVM assertion), after a
    traceback of the thread whose worker exit stopped."""
    for _ in range(2):
        t0 = time.monotonic()
        out = subprocess.run([sys.executable, "-c", EXIT_SCRIPT,
                              str(EXAMPLES / "transformer.eqir")],
                             capture_output=True, text=True, timeout=120)
        assert (out.returncode, out.stderr) == (0, "")
        assert time.monotonic() - t0 < 60


def test_a_worker_that_died_is_let_go_of_when_it_is_replaced(workers):
    """A worker that died on its own (killed, out of memory) is replaced at the next start;
    its pipes are closed then, not left to the garbage collector (a ResourceWarning each)."""
    workers(1)
    dead = compile_workers._workers[0]
    dead.proc.kill()
    dead.proc.wait()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        start_ready(1)
        gc.collect()
    assert [str(w.message) for w in caught] == []
    assert dead.proc.stdin.closed and dead.replies.closed
    assert compile_workers._workers[0] is not dead


CTRL_C_SCRIPT = """
import sys, time
import eqsat
from eqsat.backend import compile_workers, cpu, jit
compile_workers.MIN_COST = 0
compile_workers.start(1)
try:
    print("started", flush=True)
    time.sleep(30)
except KeyboardInterrupt:
    pass
workers = compile_workers._workers
while all(w.alive() for w in workers) and not all(w.usable() for w in workers):
    time.sleep(0.01)
m = eqsat.differentiate(eqsat.parse(open(sys.argv[1]).read()))
print(len(jit.unpack_objects(compile_workers.compile_objects(cpu.lower(m)[0]))))
"""


def test_ctrl_c_while_workers_start_leaves_them_running():
    """Ctrl-C in a terminal reaches its whole process group: workers still importing eqsat
    died of it, and this process compiled alone from then on (a worker that dies before it
    is ready is not started again). Workers run in a session of their own."""
    proc = subprocess.Popen([sys.executable, "-c", CTRL_C_SCRIPT, str(EXAMPLES / "mlp.eqir")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        assert proc.stdout.readline() == "started\n"
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
        proc.wait()
    assert (out, err) == ("2\n", "")


@pytest.mark.parametrize("value", ["²", "٣", "1e3", "-1", "two"])
def test_a_worker_count_that_is_not_a_plain_number_is_an_error(monkeypatch, value):
    """str.isdigit takes '²' (int() then raised a bare ValueError) and '٣'."""
    from eqsat.backend.settings import compile_workers as count

    monkeypatch.setenv("EQSAT_COMPILE_WORKERS", value)
    with pytest.raises(eqsat.Error, match="EQSAT_COMPILE_WORKERS"):
        count()


def test_a_worker_count_past_any_use_is_capped(monkeypatch):
    """A typo (EQSAT_COMPILE_WORKERS=1000000) started processes until the system refused
    one: workers beyond the most threads a process uses compile nothing sooner."""
    from eqsat.backend.settings import compile_workers as count
    from eqsat.host import MAX_THREADS

    monkeypatch.setenv("EQSAT_COMPILE_WORKERS", "99999999999999999999")
    assert count() == MAX_THREADS
    monkeypatch.setenv("EQSAT_COMPILE_WORKERS", " 2 ")
    assert count() == 2


def test_a_process_on_one_core_starts_no_worker():
    script = ("import os; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})\n"
              "os.environ.pop('EQSAT_COMPILE_WORKERS', None)\n"
              "from eqsat.backend import compile_workers\n"
              "compile_workers.start()\n"
              "print(len(compile_workers._workers))\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=60)
    assert (out.stdout, out.stderr) == ("0\n", "")


# A worker that says it is ready, takes a request, and ends its reply half-way: a header
# promising more bytes than follow, then exits (killed while replying).
HALF_REPLY = (
    "import os, struct, sys\n"
    "from eqsat.backend.compile_workers import _REQUEST, _REPLY, _hello, _read\n"
    "out = os.fdopen(int(sys.argv[1]), 'wb', buffering=0); out.write(_hello())\n"
    "size, _, _ = _REQUEST.unpack(_read(sys.stdin.buffer, _REQUEST.size))\n"
    "_read(sys.stdin.buffer, size)\n"
    "out.write(_REPLY.pack(1, 1 << 20) + b'\\x7fELF')\n"
    "os._exit(0)\n")
# One whose reply pipe is closed once it is ready; it stays alive, reading its requests.
PIPE_CLOSED = (
    "import os, sys, time\n"
    "from eqsat.backend.compile_workers import _hello\n"
    "os.write(int(sys.argv[1]), _hello()); os.close(int(sys.argv[1]))\n"
    "while sys.stdin.buffer.read(1 << 16):\n"
    "    pass\n")


@pytest.mark.parametrize("command", [HALF_REPLY, PIPE_CLOSED], ids=["half-reply", "pipe-closed"])
def test_a_worker_that_breaks_off_its_reply(workers, monkeypatch, command):
    """Its part is compiled here and the program runs; the worker is let go of (no process,
    no pipe), and a new one takes its place at the next start."""
    good = compile_workers._Worker.COMMAND
    monkeypatch.setattr(compile_workers._Worker, "COMMAND", command)
    errors = workers(1)
    bad = compile_workers._workers[0]
    m = _program()
    blob = compile_workers.compile_objects(cpu.lower(m)[0])
    check_runs(m, blob)
    assert errors == [] and bad.proc.returncode is not None and bad.replies.closed
    monkeypatch.setattr(compile_workers._Worker, "COMMAND", good)
    start_ready(1)
    assert compile_workers._workers[0] is not bad
    assert len(jit.unpack_objects(compile_workers.compile_objects(cpu.lower(m)[0]))) == 2


def test_an_interrupt_while_parts_go_out_leaves_every_worker_usable(workers, monkeypatch):
    """Ctrl-C while a thread that takes a part to a worker starts (Thread.start waits for
    it): the workers whose threads never started stayed marked busy for good, and no later
    compile gave them a part."""
    errors = workers(2)

    class Interrupted(threading.Thread):
        def start(self) -> None:
            super().start()
            raise KeyboardInterrupt

    plain = threading.Thread
    monkeypatch.setattr(threading, "Thread", Interrupted)
    m = _program()
    text = cpu.lower(m)[0]
    with pytest.raises(KeyboardInterrupt):
        compile_workers.compile_objects(text)
    monkeypatch.setattr(threading, "Thread", plain)
    deadline = time.monotonic() + 10
    while any(w.busy.locked() for w in compile_workers._workers):
        assert time.monotonic() < deadline, "a worker stayed busy"
        time.sleep(0.01)
    blob = compile_workers.compile_objects(text)
    assert len(jit.unpack_objects(blob)) == 3 and errors == []
    check_runs(m, blob)


def test_workers_import_this_eqsat_whatever_the_current_directory_holds(monkeypatch,
                                                                       tmp_path):
    """`python -c` puts the current directory first on sys.path: a directory holding an
    eqsat of its own (a checkout, a script named eqsat.py) gave workers that one, which
    here cannot start, and this process compiled alone for good."""
    (tmp_path / "eqsat.py").write_text("raise SystemExit(7)\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(compile_workers, "_broken", False)
    monkeypatch.setattr(compile_workers, "MIN_COST", 0)
    compile_workers.stop()
    try:
        compile_workers.start(1)
        deadline = time.monotonic() + 60
        worker = compile_workers._workers[0]
        while worker.alive() and not worker.usable() and time.monotonic() < deadline:
            time.sleep(0.01)
        text = cpu.lower(_program())[0]
        assert len(jit.unpack_objects(compile_workers.compile_objects(text))) == 2
    finally:
        compile_workers.stop()


BANNER_SCRIPT = """
import sys, time
import eqsat
from eqsat.backend import compile_workers, cpu, jit
compile_workers.MIN_COST = 0
compile_workers.start(1)
worker = compile_workers._workers[0]
deadline = time.monotonic() + 60
while worker.alive() and not worker.usable() and time.monotonic() < deadline:
    time.sleep(0.01)
m = eqsat.differentiate(eqsat.parse(open(sys.argv[1]).read()))
print(len(jit.unpack_objects(compile_workers.compile_objects(cpu.lower(m)[0]))))
"""


def test_what_a_worker_prints_is_no_reply(tmp_path):
    """Output a worker's Python prints (here a site's banner: a sitecustomize that prints)
    went down the pipe its replies took: a banner that starts with R read as 'ready', and
    the rest as a reply of exabytes (MemoryError in its thread, the part compiled here,
    the next exchange out of step). Replies have a pipe of their own."""
    (tmp_path / "sitecustomize.py").write_text("print('Running with the lab site settings')\n")
    script = BANNER_SCRIPT.replace("compile_workers.start", "sys.stdout.flush(); "
                                   "compile_workers.start")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", script, str(EXAMPLES / "mlp.eqir")], env=env,
                         capture_output=True, text=True, timeout=120)
    assert (out.stdout, out.stderr) == ("Running with the lab site settings\n2\n", "")


def test_stopping_workers_still_starting_does_not_wait_for_them():
    """stop() (at every interpreter exit) closed the stdin of workers still importing eqsat
    and waited for them to notice, up to 2 s each: a short script that compiled once took
    that much longer to exit. They are killed: they hold nothing yet. (Bound: under the 2 s
    one such wait took, far over the milliseconds three kills take, even on a loaded CI.)"""
    compile_workers.stop()
    compile_workers.start(3)
    t0 = time.perf_counter()
    compile_workers.stop()
    assert time.perf_counter() - t0 < 1.5


def test_an_interrupt_during_the_local_part_then_compiling_again(workers, monkeypatch):
    """Ctrl-C while this process compiles its part and a worker compiles another: the
    worker's reply goes to the interrupted compile's thread, never to a later compile, and
    every later program runs right."""
    errors = workers(1)
    worker = compile_workers._workers[0]
    real = jit.compile_object

    def interrupted(text: str) -> bytes:
        raise KeyboardInterrupt

    mlp, transformer = _program("mlp.eqir"), _program("transformer.eqir")
    monkeypatch.setattr(jit, "compile_object", interrupted)
    with pytest.raises(KeyboardInterrupt):
        compile_workers.compile_objects(cpu.lower(transformer)[0])
    monkeypatch.setattr(jit, "compile_object", real)
    check_runs(mlp, compile_workers.compile_objects(cpu.lower(mlp)[0]))
    deadline = time.monotonic() + 60
    while worker.busy.locked():
        assert time.monotonic() < deadline, "the worker stayed busy"
        time.sleep(0.01)
    blob = compile_workers.compile_objects(cpu.lower(mlp)[0])
    assert len(jit.unpack_objects(blob)) == 2 and errors == []
    check_runs(mlp, blob)


def _compile_and_check(n: int) -> int:
    """A pool task: compile a program of its own (workers of this process, started here
    where it has none) and check it against the interpreter; returns the parts it had."""
    compile_workers.MIN_COST = 0
    start_ready(1)
    m = eqsat.differentiate(eqsat.parse(
        (EXAMPLES / "mlp.eqir").read_text().replace("128", str(8 + n))))
    blob = compile_workers.compile_objects(cpu.lower(m)[0])
    check_runs(m, blob)
    return len(jit.unpack_objects(blob))


def test_threads_compiling_at_once_with_workers(workers):
    workers(2)
    with ThreadPoolExecutor(4) as pool:
        assert set(pool.map(_compile_and_check, range(8))) <= {1, 2, 3}


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_a_process_pool_compiling_with_workers_started_here_first(workers, method):
    """Workers started in this process first: a forked child closes its copies of their
    pipes and starts workers of its own; a spawned one starts its own."""
    workers(1)
    _compile_and_check(0)
    with multiprocessing.get_context(method).Pool(2) as pool:
        assert pool.map(_compile_and_check, range(1, 5)) == [2] * 4
    assert _compile_and_check(5) == 2


def _ended(w: compile_workers._Worker) -> bool:
    return w.proc.returncode is not None and w.proc.stdin.closed and w.replies.closed


@pytest.mark.parametrize("how", ["argument", "setting"])
def test_starting_fewer_workers_ends_the_extras(workers, monkeypatch, how):
    """start(n) leaves n workers: asked for fewer than run (a smaller count, or the default
    one after the load rose), the extras kept running for the life of the process."""
    workers(3)
    first, *extras = compile_workers._workers
    if how == "setting":
        monkeypatch.setenv("EQSAT_COMPILE_WORKERS", "1")
        compile_workers.start()
    else:
        compile_workers.start(1)
    assert compile_workers._workers == [first] and first.alive()
    assert all(_ended(w) for w in extras)
    compile_workers.start(0)
    assert compile_workers._workers == [] and _ended(first)


def test_an_extra_worker_with_a_part_finishes_it_then_ends(workers, monkeypatch):
    """A worker made extra while it compiles a part (start(0) in another thread, here while
    this process compiles its own part) is not killed under it: its part comes back, and
    the worker ends once its exchange is done."""
    errors = workers(2)
    running = list(compile_workers._workers)
    real = jit.compile_object

    def local(text: str) -> bytes:
        compile_workers.start(0)
        return real(text)

    monkeypatch.setattr(jit, "compile_object", local)
    m = _program()
    blob = compile_workers.compile_objects(cpu.lower(m)[0])
    monkeypatch.setattr(jit, "compile_object", real)
    assert len(jit.unpack_objects(blob)) == 3 and errors == []
    assert compile_workers._workers == [] and all(_ended(w) for w in running)
    check_runs(m, blob)
