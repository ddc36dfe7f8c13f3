"""The fusion pass adds its terms inside one rule per batch, binding no global name."""

import json

import eqsat
from eqsat.rules import bridge, runner
from eqsat.rules.compile import compile_ruleset
from eqsat.rules.fusion import _PASS, fusion

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
