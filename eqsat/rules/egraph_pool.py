"""Native e-graphs kept with the schema and a rule set already declared, for the next module.

Declaring eqsat's schema (sorts, constructors, the analysis rules) and the built-in rule set
in a new egglog e-graph, and the first runs that compile their queries, cost more than
saturating a small program does: ~0.2 s of every `optimize` in a warm process. egglog's `push`
and `pop` save and restore a whole e-graph, so an e-graph is handed out pushed above its
declarations and, when its module is done with, popped back and kept for the next one: each
declaration is paid once per process, thread, schema and rule set. The schema is the
prelude's variant (checked, or unchecked for sets of well-typed rules: `schema.prelude`):
an e-graph is kept under both names, so none declared for one is handed out for another. An
e-graph whose use failed is dropped, never reused.

egglog's e-graph belongs to the thread that made it (pyo3 panics where another thread uses
or drops it), so each thread keeps its own: they go with the thread when it ends.
egglog frees an e-graph on its thread pool (rayon), whose threads a forked child does not
have: freeing one there never returns. A kept e-graph found anywhere but in the process and
thread that made it (a forked child; the interpreter's end, for a daemon thread's) is never
freed.
"""

from __future__ import annotations

import ctypes
import os
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from ..errors import ForkedProcessError

KEEP_RULE_SETS = 4  # rule sets whose e-graphs a thread keeps (the built-in one, a user's few)

_generation = 0  # bumped by `clear`: a thread drops what it kept before, at its next use
_generation_lock = threading.Lock()
_made = False  # this process made an e-graph: egglog's thread pool may be running
_forked_after_use = False  # forked from a process that had made one: egglog cannot run here


class _Native:
    """A kept native e-graph, freed with this holder only where it was made."""

    __slots__ = ("native", "made_in")

    def __init__(self, native: Any) -> None:
        self.native = native
        self.made_in = (os.getpid(), threading.get_ident())

    def __del__(self, _getpid: Callable[[], int] = os.getpid,
                _ident: Callable[[], int] = threading.get_ident,
                _incref: Callable[[Any], None] = ctypes.pythonapi.Py_IncRef) -> None:
        if (_getpid(), _ident()) != self.made_in:
            _incref(ctypes.py_object(self.native))  # a reference never given back


class _Kept(threading.local):
    """One thread's kept e-graphs: (schema, rule set program) -> holder, least recent first."""

    def __init__(self) -> None:
        self.natives: OrderedDict[tuple[str, str], _Native] = OrderedDict()
        self.generation = _generation


_local = _Kept()


def _own() -> OrderedDict[tuple[str, str], _Native]:
    """This thread's kept e-graphs, emptied where `clear` was called since it last looked."""
    if _local.generation != _generation:
        _local.natives.clear()
        _local.generation = _generation
    return _local.natives


def take(rules: str, make: Callable[[], Any], declare: Callable[[Any, str], None],
         schema: str = "checked") -> Any:
    """A native e-graph with the schema variant `schema` and `rules` (egglog program text, ""
    for none) declared, pushed: one this thread kept for both, else `make()` declared through
    `declare(native, program)` (the schema is `make`'s to declare, the variant `schema` names).
    It may be used and given back by this thread only; ForkedProcessError in a process forked
    after egglog ran."""
    global _made
    if _forked_after_use:
        raise ForkedProcessError(
            "eqsat cannot optimize in this process: it was forked (os.fork, or "
            "multiprocessing's 'fork' start method) from a process that had optimized, and "
            "egglog's thread pool does not survive a fork (an e-graph made here could never "
            "be freed: the process would hang). Start worker processes with "
            "multiprocessing.get_context('spawn') or 'forkserver', or before the first "
            "optimization; programs whose optimization is in eqsat's disk cache still "
            "compile here.")
    kept = _own().pop((schema, rules), None)
    if kept is not None:
        return kept.native
    _made = True
    native = make()
    if rules:
        declare(native, rules)
    declare(native, "(push)")
    return native


def give(native: Any, rules: str, declare: Callable[[Any, str], None],
         schema: str = "checked") -> None:
    """Pop `native` (taken by this thread) back to its declarations and keep it for this
    thread's next `take(rules, ..., schema)`."""
    declare(native, "(pop)")
    declare(native, "(push)")
    kept = _own()
    key = (schema, rules)
    if key not in kept:
        kept[key] = _Native(native)
    kept.move_to_end(key)
    while len(kept) > KEEP_RULE_SETS:
        kept.popitem(last=False)


def kept(rules: str, schema: str = "checked") -> list[Any]:
    """The e-graphs this thread keeps for `rules` over `schema` (for tests and reports)."""
    kept = _own().get((schema, rules))
    return [] if kept is None else [kept.native]


def kept_rule_sets() -> int:
    """How many rule sets this thread keeps an e-graph for."""
    return len(_own())


def clear() -> None:
    """Drop every kept e-graph: this thread's now, other threads' at their next use (an
    e-graph may be dropped only by the thread that made it)."""
    global _generation
    with _generation_lock:
        _generation += 1
    _own()


def _forget_after_fork() -> None:
    """In a forked child: the e-graphs this thread kept in the parent are never used (egglog
    could not free what a module adds to them) nor freed (see the module docstring), and
    where the parent ran egglog, no e-graph is made here. Another thread of the parent may
    have held the lock of `clear`: the child gets one of its own."""
    global _forked_after_use, _generation_lock
    _forked_after_use = _forked_after_use or _made
    _generation_lock = threading.Lock()
    _local.natives.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)
