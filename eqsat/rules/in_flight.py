"""The calls into native code running now (egglog, HiGHS), so that the interpreter's exit
waits for them.

egglog and the HiGHS that scipy ships release the GIL while they run. A daemon thread (a
server's background optimization) whose call returned while the interpreter was finalizing was
ended inside their Rust or C++ frames, which aborted the whole process; `native_call` wraps
every such call, and exit drains them.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import threading
from collections.abc import Iterator


class InFlight:
    """A count of calls under way: at interpreter exit it waits for them and holds back new
    ones (a call that returned during finalization ended its thread with pthread_exit inside
    Rust or C++: "FATAL: exception not rethrown", "terminate called without an active
    exception", or a segfault)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._count = 0
        self._closed = False
        self._depth = threading.local()  # this thread's calls under way, nested ones counted
        atexit.register(self.drain)
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=self._forget)

    def _forget(self) -> None:
        """In a forked child: the parent's calls do not run here, so exit must not wait."""
        self._cond = threading.Condition()
        self._count = 0
        self._depth = threading.local()

    @contextlib.contextmanager
    def call(self) -> Iterator[None]:
        """Around one call into native code that releases the GIL; after `drain` it never
        starts, unless it is nested in a call of this thread under way (which `drain` waits
        for: held back, the inner call would hang the exit)."""
        depth = getattr(self._depth, "n", 0)
        if depth:
            self._depth.n = depth + 1
            try:
                yield
            finally:
                self._depth.n = depth
            return
        with self._cond:
            self._cond.wait_for(lambda: not self._closed)
            self._count += 1
        self._depth.n = 1
        try:
            yield
        finally:
            self._depth.n = 0
            with self._cond:
                self._count -= 1
                self._cond.notify_all()

    def drain(self) -> None:
        """Hold back new calls and wait for those running to return."""
        with self._cond:
            self._closed = True
            self._cond.wait_for(lambda: self._count == 0)


_calls = InFlight()
native_call = _calls.call
