"""The built-in rule set: algebraic + layout + fusion."""

from __future__ import annotations

import functools

from .algebraic import algebraic
from .fusion import fusion
from .lang import Rule, RuleSet
from .layout import layout

# Built-in rules that hold for real numbers but change results at inf, NaN or overflow (as
# fast-math's reassociation does); `check(..., ieee=True)` refuses exactly these.
IEEE_UNSAFE = ("log_exp", "exp_add", "factor_mul_add", "factor_mul_sub", "factor_add_mul",
               "matmul_factor_left", "matmul_factor_right", "mm_assoc_right", "mm_assoc_left",
               "div_bcast_recip")

def default(ieee: bool = False) -> RuleSet:
    """The built-in rules (algebraic + layout + fusion); with `ieee=True` without
    IEEE_UNSAFE, so optimized programs give numpy's values at inf, NaN and overflow too."""
    name, rules = _built(bool(ieee))
    return RuleSet(rules, name)


@functools.cache
def _built(ieee: bool) -> tuple[str, tuple[Rule, ...]]:
    """The set's name and rules, once per process: parsing and checking the built-in text took
    ~15 ms, paid by every optimize that used the built-in rules. Rules are frozen and the
    tuple immutable; `default` wraps them in a RuleSet of its own for each caller, so what one
    does to the set it got (adding to it, rebinding its attributes) never reaches the next."""
    if ieee:
        name, rules = _built(False)
        built = RuleSet(rules, name).without(*IEEE_UNSAFE)
    else:
        built = algebraic() + layout() + fusion()
    return built.name, built.rules
