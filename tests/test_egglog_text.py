"""egglog_text builds from action text the command objects egglog's parser would, without
the parser's spans (which make a parsed program quadratic in its length); the fusion pass adds
its terms that way, binding no global name."""

import json
import math
import re

import pytest

import eqsat
from eqsat.rules import bridge, egglog_text, runner
from eqsat.rules.compile import compile_ruleset
from eqsat.rules.egglog_native import bindings
from eqsat.rules.fusion import _PASS, fusion

_SCHEMA = """(datatype E (N i64) (F f64) (S String) (B bool) (P E E))
(function tag (E) i64 :merge new)"""

_ACTIONS = [
    '(let a (P (N 3) (N -42)))',
    '(let b (P a (F 0.125)))',
    '(union b (P (F 1e-05) (F -2.5)))',
    '(P (F NaN) (F inf)) (P (F -inf) (F 5.0))',
    r'(S "q\"uote \\ back\nline\ttab $0 (paren)")',
    '(P (B true) (B false))',
    '(S "") (N 9223372036854775807) (N -9223372036854775808)',
    '(let big (S "x"))  (union big (N +7))',
]


def _run(commands: list) -> str:
    native = bindings.EGraph()
    native.run_program(*native.parse_program(_SCHEMA))
    native.run_program(*commands)
    return native.serialize([]).to_json()


def test_actions_build_what_egglog_parses():
    native = bindings.EGraph()
    text = f"(ruleset r)\n(rule () ({' '.join(_ACTIONS)}) :ruleset r :name \"r\")\n(run r 1)"
    parsed = _run(native.parse_program(text))
    built = _run(egglog_text.run_once("r", _ACTIONS))
    assert built == parsed
    assert "uote" in built and "9223372036854775807" in built  # both were made


def test_atoms_read_as_egglog_reads_them():
    (n, f, neg, nan, s, v, t) = egglog_text.actions(
        '7 0.5 -inf NaN "a\\tb" name true')
    assert n.expr.value.value == 7 and f.expr.value.value == 0.5
    assert neg.expr.value.value == -math.inf and math.isnan(nan.expr.value.value)
    assert s.expr.value.value == "a\tb" and v.expr.name == "name"
    assert t.expr.value.value is True


@pytest.mark.parametrize("text, message", [
    ('(S "a\\qb")', "unrecognized escape"),
    ("(P (N 1)", "unbalanced '('"),
    ("(N 1))", "unbalanced ')'"),
    ("((N 1) 2)", "starts with a name"),
])
def test_text_it_cannot_read_is_an_error(text, message):
    with pytest.raises(egglog_text.EgglogTextError, match=re.escape(message)):
        egglog_text.actions(text)


_MLP = """module @mlp
func @loss(%x: f32[16,8], %w: f32[8,4], %b: f32[4], %y: f32[16,4]) -> f32[] {
  %0 = matmul %x, %w : f32[16,4]
  %1 = broadcast %b : f32[16,4]
  %2 = add %0, %1 : f32[16,4]
  %p = relu %2 : f32[16,4]
  %d = sub %p, %y : f32[16,4]
  %s = mul %d, %d : f32[16,4]
  %l = sum %s, axes=[0,1] : f32[]
  return %l
}
func @g = grad @loss wrt %w, %b
"""


def _global_names(eg: bridge.EGraph) -> set[str]:
    data = json.loads(eg.native.serialize([]).to_json())
    return {name.strip() for d in data["class_data"].values()
            for name in (d.get("let") or "").split(",") if name.strip()}


def test_the_fusion_pass_binds_no_global_name():
    # every top-level `let` made a table egglog keeps (and copies at each push and pop)
    eg = bridge.load(eqsat.differentiate(eqsat.parse(_MLP)))
    eg.add_rules(compile_ruleset(fusion()))
    eg.analyze()
    eg.run(runner._REWRITE)
    assert sum(_PASS.run(eg, 10_000).values()) > 0
    assert _global_names(eg) == set(eg.lets)  # the module's values' names only
