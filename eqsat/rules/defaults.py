"""The built-in rule set: algebraic + layout + fusion."""

from __future__ import annotations

from .algebraic import algebraic
from .fusion import fusion
from .lang import RuleSet
from .layout import layout

# Built-in rules that hold for real numbers but change results at inf, NaN or overflow (as
# fast-math's reassociation does); `check(..., ieee=True)` refuses exactly these.
IEEE_UNSAFE = ("log_exp", "exp_add", "factor_mul_add", "factor_mul_sub", "factor_add_mul",
               "matmul_factor_left", "matmul_factor_right", "mm_assoc_right", "mm_assoc_left",
               "div_bcast_recip")


def default(ieee: bool = False) -> RuleSet:
    """The built-in rules (algebraic + layout + fusion); with `ieee=True` without
    IEEE_UNSAFE, so optimized programs give numpy's values at inf, NaN and overflow too."""
    rules = algebraic() + layout() + fusion()
    return rules.without(*IEEE_UNSAFE) if ieee else rules
