"""The built-in rule set: algebraic + layout + fusion."""

from __future__ import annotations

from .algebraic import algebraic
from .fusion import fusion
from .lang import Rule, RuleSet
from .layout import layout

# Built-in rules that hold for real numbers but change results at inf, NaN or overflow (as
# fast-math's reassociation does); `check(..., ieee=True)` refuses exactly these.
IEEE_UNSAFE = ("log_exp", "exp_add", "factor_mul_add", "factor_mul_sub", "factor_add_mul",
               "matmul_factor_left", "matmul_factor_right", "mm_assoc_right", "mm_assoc_left",
               "div_bcast_recip")

# ieee -> (set name, rules): parsing and checking the built-in text took ~15 ms, paid by
# every optimize that used the built-in rules. Rules are frozen and the tuple is immutable;
# each call wraps them in a RuleSet of its own, so what a caller does to the set it got
# (adding to it, rebinding its attributes) never reaches the next caller.
_BUILT: dict[bool, tuple[str, tuple[Rule, ...]]] = {}


def default(ieee: bool = False) -> RuleSet:
    """The built-in rules (algebraic + layout + fusion); with `ieee=True` without
    IEEE_UNSAFE, so optimized programs give numpy's values at inf, NaN and overflow too."""
    ieee = bool(ieee)
    if ieee not in _BUILT:
        if False not in _BUILT:
            rules = algebraic() + layout() + fusion()
            _BUILT[False] = (rules.name, rules.rules)
        if ieee:
            rules = RuleSet(_BUILT[False][1], _BUILT[False][0]).without(*IEEE_UNSAFE)
            _BUILT[True] = (rules.name, rules.rules)
    name, rules = _BUILT[ieee]
    return RuleSet(rules, name)
