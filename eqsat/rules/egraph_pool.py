"""Native e-graphs kept with the schema and a rule set already declared, for the next module.

Declaring eqsat's schema (sorts, constructors, the analysis rules) and the built-in rule set
in a new egglog e-graph, and the first runs that compile their queries, cost more than
saturating a small program does: ~0.2 s of every `optimize` in a warm process. egglog's `push`
and `pop` save and restore a whole e-graph, so an e-graph is handed out pushed above its
declarations and, when its module is done with, popped back and kept for the next one: each
declaration is paid once per process, thread and rule set. An e-graph whose use failed is
dropped, never reused.

egglog's e-graph belongs to the thread that made it (pyo3 panics where another thread uses
or drops it), so each thread keeps its own: they go with the thread when it ends.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

KEEP_RULE_SETS = 4  # rule sets whose e-graphs a thread keeps (the built-in one, a user's few)

_generation = 0  # bumped by `clear`: a thread drops what it kept before, at its next use
_generation_lock = threading.Lock()


class _Kept(threading.local):
    """One thread's kept e-graphs: rule set program -> native e-graph, least recent first."""

    def __init__(self) -> None:
        self.natives: OrderedDict[str, Any] = OrderedDict()
        self.generation = _generation


_local = _Kept()


def _own() -> OrderedDict[str, Any]:
    """This thread's kept e-graphs, emptied where `clear` was called since it last looked."""
    if _local.generation != _generation:
        _local.natives.clear()
        _local.generation = _generation
    return _local.natives


def take(rules: str, make: Callable[[], Any], declare: Callable[[Any, str], None]) -> Any:
    """A native e-graph with the schema and `rules` (egglog program text, "" for none)
    declared, pushed: one this thread kept, else `make()` declared through
    `declare(native, program)` (the schema is `make`'s to declare). It may be used and given
    back by this thread only."""
    native = _own().pop(rules, None)
    if native is not None:
        return native
    native = make()
    if rules:
        declare(native, rules)
    declare(native, "(push)")
    return native


def give(native: Any, rules: str, declare: Callable[[Any, str], None]) -> None:
    """Pop `native` (taken by this thread) back to its declarations and keep it for this
    thread's next `take(rules)`."""
    declare(native, "(pop)")
    declare(native, "(push)")
    kept = _own()
    kept.setdefault(rules, native)
    kept.move_to_end(rules)
    while len(kept) > KEEP_RULE_SETS:
        kept.popitem(last=False)


def kept(rules: str) -> list[Any]:
    """The e-graphs this thread keeps for `rules` (for tests and reports)."""
    native = _own().get(rules)
    return [] if native is None else [native]


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
