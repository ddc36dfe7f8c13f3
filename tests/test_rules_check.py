"""Every built-in rule passes the soundness check."""

import pytest

import eqsat
from eqsat.rules import check_rule, default

RULES = list(default())


@pytest.mark.parametrize("rule", RULES, ids=[r.name for r in RULES])
def test_builtin_rule_is_sound(rule):
    check_rule(rule, examples=15)


def test_integer_overflow_makes_a_rule_unsound():
    """Integers wrap around: x * 2 / 2 is not x where x * 2 overflows, and check draws values
    from the whole range of i32 and i64 now and then."""
    with pytest.raises(eqsat.UnsoundRule, match="d2"):
        eqsat.rules.check(eqsat.rules.parse("rule d2: div(mul(?x, const(2)), const(2)) => ?x"))
