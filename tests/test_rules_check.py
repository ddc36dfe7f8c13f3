"""Every built-in rule passes the soundness check."""

import pytest

from eqsat.rules import check_rule, default

RULES = list(default())


@pytest.mark.parametrize("rule", RULES, ids=[r.name for r in RULES])
def test_builtin_rule_is_sound(rule):
    check_rule(rule, examples=15)
