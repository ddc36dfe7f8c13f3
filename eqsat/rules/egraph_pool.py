"""Native e-graphs kept with the schema and a rule set already declared, for the next module.

Declaring eqsat's schema (sorts, constructors, the analysis rules) and the built-in rule set
in a new egglog e-graph, and the first runs that compile their queries, cost more than
saturating a small program does: ~0.2 s of every `optimize` in a warm process. egglog's `push`
and `pop` save and restore a whole e-graph, so an e-graph is handed out pushed above its
declarations and, when its module is done with, popped back and kept for the next one: each
declaration is paid once per process and rule set. An e-graph whose use failed is dropped,
never reused.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

KEEP_RULE_SETS = 4  # rule sets whose e-graphs are kept (the built-in one, a user's few)
KEEP_PER_RULE_SET = 2  # e-graphs kept per rule set: one per thread optimizing at once

_lock = threading.Lock()
_kept: OrderedDict[str, list[Any]] = OrderedDict()


def take(rules: str, make: Callable[[], Any], declare: Callable[[Any, str], None]) -> Any:
    """A native e-graph with the schema and `rules` (egglog program text, "" for none)
    declared, pushed: a kept one, else `make()` declared through `declare(native, program)`
    (the schema is `make`'s to declare)."""
    with _lock:
        kept = _kept.get(rules)
        if kept:
            _kept.move_to_end(rules)
            return kept.pop()
    native = make()
    if rules:
        declare(native, rules)
    declare(native, "(push)")
    return native


def give(native: Any, rules: str, declare: Callable[[Any, str], None]) -> None:
    """Pop `native` back to its declarations and keep it for the next `take(rules)`."""
    declare(native, "(pop)")
    declare(native, "(push)")
    with _lock:
        kept = _kept.setdefault(rules, [])
        _kept.move_to_end(rules)
        if len(kept) < KEEP_PER_RULE_SET:
            kept.append(native)
        while len(_kept) > KEEP_RULE_SETS:
            _kept.popitem(last=False)


def clear() -> None:
    """Drop every kept e-graph."""
    with _lock:
        _kept.clear()
