"""Parallel compilation: worker processes compile parts of a program's LLVM IR (llvm_split)
while this process compiles one part itself.

llvmlite runs every call into LLVM under one process-wide lock, so threads cannot compile at
the same time; processes can. A worker is a Python process serving requests on its stdin
(`serve`): LLVM IR text in, an object file out. `start` launches them in the background, which
eqsat.compile does before it optimizes, so they are ready when lowering ends; a cold compile of
the MLP training step spends ~0.45 s in LLVM, of which its larger half takes ~0.26 s. Without
running workers, or for a module too small to pay for the exchange, compiling happens here as
before; a worker that fails, dies or stops answering (`WAIT_S`) has its part compiled here
(where a real error shows). How many run: EQSAT_COMPILE_WORKERS, by default one less than the
usable cores, at most 3 (0: none).
A worker answers on a pipe of its own (its file descriptor is its one argument), not on its
stdout: whatever its Python prints (a site's banner) is no reply. It says it is ready with the
fingerprint of the code generator it imported (`jit.fingerprint`): one that imported source
edited since this process imported its own would compile with other code than the objects'
cache key says, and is not used.
"""

from __future__ import annotations

import atexit
import os
import re
import select
import signal
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from . import jit, llvm_split
from .settings import compile_workers

# The estimated cost (llvm_split._cost: ~23,000 a second of LLVM) below which one process
# compiles the module faster than splitting and exchanging it (about 0.1 s of LLVM).
MIN_COST = 2000
# How long a compile waits for the workers' parts once its own is done: WAIT_S, and WAIT_RATIO
# times what its own part took (the smallest; the others take up to ~2x as long, more on a
# loaded machine). A worker not done by then (stopped by SIGSTOP or a debugger, a machine
# swapping) is ended and its part compiled here: the compile waited for its reply for good.
WAIT_S = 5.0
WAIT_RATIO = 10.0
_REQUEST = struct.Struct("<QII")  # text bytes, -O level, unroll
_REPLY = struct.Struct("<BQ")  # ok, payload bytes
_READY = b"R"  # what a worker writes once it can take requests, then its `jit.fingerprint()`

_workers: list[_Worker] = []
_inherited: list[_Worker] = []  # a forked child's: its parent's workers
_lock = threading.Lock()
_broken = False  # a worker could not start, or ran other code: this process compiles alone


class WorkerError(Exception):
    """A worker could not compile its part (it died, or LLVM failed there)."""


class _Worker:
    """One worker process, the pipe of its requests (its stdin) and the pipe of its
    replies; used by one compile at a time."""

    COMMAND = "from eqsat.backend.compile_workers import serve; serve()"

    def __init__(self) -> None:
        package_root = str(Path(__file__).resolve().parent.parent.parent)
        path = os.environ.get("PYTHONPATH")
        env = {**os.environ, "PYTHONPATH": package_root + (os.pathsep + path if path else "")}
        read_end, write_end = os.pipe()
        try:
            self.proc = subprocess.Popen(
                # -P: not the current directory first on sys.path (-c puts it there), where
                # an eqsat of its own (a checkout, a script eqsat.py) stood before this one
                [sys.executable, "-P", "-c", self.COMMAND, str(write_end)],
                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                env=env, pass_fds=(write_end,),
                bufsize=0,  # unbuffered: a forked child can drop the pipes without flushing
                # out of the terminal's process group: a Ctrl-C there killed workers still
                # importing (those that cannot start are not started again)
                start_new_session=True)
        except BaseException:
            os.close(read_end)
            raise
        finally:
            os.close(write_end)
        self.replies = os.fdopen(read_end, "rb", buffering=0)
        self.busy = threading.Lock()
        self.ready = False
        self.said = b""  # of its hello so far
        self.retired = False  # out of the pool: ended by whoever holds it last

    def release(self) -> None:
        """Let go of `busy`; a worker retired meanwhile is ended (by this holder or, where
        it retires the worker after this check, by `_retire`)."""
        self.busy.release()
        if self.retired:
            self.end_if_free()

    def end_if_free(self) -> None:
        """End the worker unless a compile holds it (that holder ends it: `release`)."""
        if self.busy.acquire(blocking=False):
            try:
                self.discard()
            finally:
                self.busy.release()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def usable(self) -> bool:
        """Alive and done starting: a part sent to a worker still importing would wait for
        it, where this process might have compiled it already. A worker says it is ready
        with the fingerprint of the code it runs (`_hello`): one that imported other source
        (edited since this process imported its own) would compile with other code than
        this process caches its objects under, so it is ended (and, as one that died before
        it was ready, none is started again). Called with `busy` held."""
        if not self.ready and self.alive():
            hello = _hello()
            try:
                readable, _, _ = select.select([self.replies], [], [], 0)
                # one read, of what is there: never waits for the rest of a hello
                chunk = self.replies.read(len(hello) - len(self.said)) if readable else None
            except (OSError, ValueError):
                chunk = b""
            if chunk is not None:
                self.said += chunk
                if not chunk or not hello.startswith(self.said):
                    self.discard()  # it ended, or runs other code
                self.ready = self.said == hello
        return self.ready and self.alive()

    def compile(self, text: str, level: int, unroll: bool) -> bytes:
        """The object file of `text` (attributes applied) compiled by this worker."""
        data = text.encode()
        try:
            assert self.proc.stdin is not None
            _write(self.proc.stdin, _REQUEST.pack(len(data), level, int(unroll)) + data)
            ok, size = _REPLY.unpack(_read(self.replies, _REPLY.size))
            payload = _read(self.replies, size)
        except (OSError, ValueError, WorkerError) as e:  # ValueError: `stop` closed its pipes
            self.discard()  # never reused: its pipes may hold half an exchange
            raise WorkerError(f"the compile worker failed: {e}") from e
        if not ok:
            raise WorkerError(payload.decode(errors="replace"))
        return payload

    def close(self) -> None:
        """End the worker: one known ready exits when its stdin closes; any other (one still
        starting would notice only once it has imported eqsat) is killed, as it holds nothing
        yet. Its hello is not read here: that takes this process's fingerprint, which at exit
        (`stop`) may not have been computed, and LLVM then set up only for it."""
        if not (self.ready and self.alive()):
            self.discard()
            return
        self._close_pipes()
        try:
            self.proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            self.discard()

    def discard(self) -> None:
        """End the worker now, and let go of its process and pipes."""
        self.proc.kill()
        self.proc.wait()
        self._close_pipes()

    def _close_pipes(self) -> None:
        for pipe in (self.proc.stdin, self.replies):
            if pipe is not None:
                pipe.close()


def _write(pipe: Any, data: bytes) -> None:
    """All of `data` to a raw pipe (one write may take only part of it)."""
    view = memoryview(data)
    while view:
        view = view[pipe.write(view):]


def _read(pipe: Any, size: int) -> bytes:
    """Exactly `size` bytes from a raw pipe; WorkerError where it ends first."""
    chunks, left = [], size
    while left:
        chunk = pipe.read(min(left, 1 << 20))  # never a buffer of the size a reply claims
        if not chunk:
            raise WorkerError("the compile worker exited")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _hello() -> bytes:
    """What a worker writes once it is ready: one byte, and the fingerprint of the code it
    compiles with (a millisecond at its start: it reads the backend's source)."""
    return _READY + jit.fingerprint().encode()


def _is_python(executable: str | None) -> bool:
    """Whether `executable` is a Python interpreter: embedded Pythons (uWSGI, a frozen app)
    name their host program there, which must not be run as a worker."""
    name = Path(executable or "").name.lower()
    return bool(re.fullmatch(r"(python|pypy)[\d.]*(\.exe)?", name))


def _retire(w: _Worker) -> None:
    """End a worker taken out of `_workers`: now where no compile holds it, else once its
    holder lets go of it (`release`), its exchange done."""
    w.retired = True
    w.end_if_free()


def start(count: int | None = None) -> None:
    """Have `count` workers running (default: EQSAT_COMPILE_WORKERS or the usable cores less
    one, at most 3), starting those missing and ending the newest beyond `count` (one with a
    part ends once its part is done); returns without waiting for them to be ready."""
    global _broken
    want = compile_workers() if count is None else count
    if want and not _is_python(sys.executable):
        return
    with _lock:
        # one that died before it was ready cannot start here (it could not import eqsat, say):
        # its successors would fail alike, so none is started again
        _broken = _broken or any(not w.ready and not w.alive() for w in _workers)
        gone = [w for w in _workers if not w.alive()]
        gone += [w for w in _workers if w not in gone][want:]
        for w in gone:
            _workers.remove(w)
            _retire(w)
        while not _broken and len(_workers) < want:
            try:
                _workers.append(_Worker())
            except Exception:  # no process to be had: compile here
                _broken = True


def stop() -> None:
    """End every worker of this process. One in an exchange (a compile in another thread, a
    daemon thread's at the interpreter's exit) is killed: the thread waiting for its reply
    reads the end of its pipe and that part is compiled there."""
    with _lock:
        workers, _workers[:] = list(_workers), []
    for w in workers:
        held = w.busy.acquire(blocking=False)
        if not held:
            w.proc.kill()
            # the exchange ends at once; past this, its holder is not in one (it was
            # interrupted meanwhile) and a pipe closed under it reads as a failed worker
            held = w.busy.acquire(timeout=2)
        try:
            w.close()
        finally:
            if held:
                w.busy.release()


class _Exchange:
    """One part on its way to a worker, in a thread of its own. Once that thread runs it owns
    the worker (holds its `busy`) until the exchange ends, even where the compile that asked
    is interrupted meanwhile; until then `cancel` gives the worker back."""

    def __init__(self, worker: _Worker, text: str) -> None:
        self.worker, self.text = worker, text
        self.level, self.unroll = jit.SPEED_LEVEL, jit.UNROLL_LOOPS
        self.result: bytes | None = None  # None: this process compiles the part
        self.thread = threading.Thread(target=self._run, daemon=True)
        self._guard = threading.Lock()
        self._state = "new"  # then "running" or "cancelled"

    def _run(self) -> None:
        with self._guard:
            if self._state == "cancelled":
                return
            self._state = "running"
        try:
            self.result = self.worker.compile(jit.with_function_attributes(self.text),
                                              self.level, self.unroll)
        except WorkerError:
            pass  # compiled by the process that asked, where a real error is raised
        finally:
            self.worker.release()

    def cancel(self) -> None:
        """Give the worker back, unless the thread runs already (then it does)."""
        with self._guard:
            if self._state != "new":
                return
            self._state = "cancelled"
        self.worker.release()


def _idle() -> list[_Worker]:
    """The workers ready for a part, each held (`busy`) for the caller."""
    idle = []
    with _lock:
        for w in _workers:  # only the holder of `busy` reads a worker's pipe
            if w.busy.acquire(blocking=False):
                if w.usable():
                    idle.append(w)
                else:
                    w.release()
    return idle


def compile_objects(text: str) -> bytes:
    """The object code of LLVM IR text (packed as `jit.pack_objects`): compiled in parts, in
    parallel, where workers are running and the module is large enough to pay; else here."""
    idle = _idle()
    try:
        parts = llvm_split.split(text, len(idle) + 1, MIN_COST) if idle else [text]
    except BaseException:
        for w in idle:
            w.release()
        raise
    for w in idle[len(parts) - 1:]:
        w.release()
    if len(parts) == 1:
        return jit.compile_object(text)
    # the smallest part here: this process also loads the objects when they are done
    parts.sort(key=len)
    exchanges = [_Exchange(w, p) for w, p in zip(idle, parts[1:])]
    started: list[_Exchange] = []
    try:
        for e in exchanges:
            e.thread.start()
            started.append(e)
    except BaseException as error:
        # an interrupt while a thread starts (start waits for it), or no thread to be had:
        # the workers of threads not running yet are given back
        for e in exchanges:
            e.cancel()
        if not isinstance(error, RuntimeError):
            raise
    t0 = time.monotonic()
    first = jit.compile_object(parts[0])
    deadline = time.monotonic() + WAIT_S + WAIT_RATIO * (time.monotonic() - t0)
    for e in started:
        e.thread.join(max(0.0, deadline - time.monotonic()))
        if e.thread.is_alive():  # its reply reads as the end of its pipe: compiled here
            e.worker.proc.kill()
            e.thread.join()
    return jit.pack_objects([first] + [e.result if e.result is not None
                                       else jit.compile_object(e.text) for e in exchanges])


def serve() -> None:
    """A worker's loop: compile each request on stdin, answer on the pipe whose file
    descriptor is its argument, until stdin closes."""
    # an interrupt is the parent's to handle; a worker ends when the parent closes its stdin
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    inp, out = sys.stdin.buffer, os.fdopen(int(sys.argv[1]), "wb", buffering=0)
    jit.target_machine()
    out.write(_hello())
    out.flush()
    while True:
        try:
            size, level, unroll = _REQUEST.unpack(_read(inp, _REQUEST.size))
            text = _read(inp, size).decode()
        except WorkerError:  # stdin closed: the process it served is done with it
            return
        try:
            ok, payload = 1, jit.target_machine().emit_object(
                jit.optimize_attributed(text, level, bool(unroll)))
        except Exception as e:  # reported to the process that asked: it compiles the part
            ok, payload = 0, f"{type(e).__name__}: {e}".encode()
        out.write(_REPLY.pack(ok, len(payload)) + payload)
        out.flush()


def _forget_after_fork() -> None:
    """A forked child shares its parent's pipes: it closes its copies (the workers stay the
    parent's) and starts workers of its own when it compiles. The fork waited for `_lock`, so
    no worker was half made: a child forked while `start` had a worker's reply pipe open, not
    yet in `_workers`, kept that end open, and the worker's death never read as an end in
    the parent while the child lived."""
    for w in _workers:
        for pipe in (w.proc.stdin, w.replies):
            if pipe is not None:
                pipe.close()
    # kept: a process handle dropped before its process was waited for warns that it still
    # runs, and these are not this process's to wait for
    _inherited.extend(_workers)
    _workers.clear()


atexit.register(stop)
jit.hold_across_fork(_lock)  # after jit's own: `_idle` asks LLVM for the fingerprint inside it
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)
