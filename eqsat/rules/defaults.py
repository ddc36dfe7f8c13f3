"""The built-in rule set: algebraic + fusion + layout."""

from __future__ import annotations

from .algebraic import algebraic
from .lang import RuleSet
from .layout import layout


def default() -> RuleSet:
    """The built-in rules (algebraic + layout; fusion joins once its op family is encoded)."""
    rules = algebraic() + layout()
    try:
        from .fusion import fusion
    except ImportError:
        return rules
    return rules + fusion()
