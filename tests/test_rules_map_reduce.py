"""User rules that make a `map_reduce`: typed in the e-graph from its operands, axes and body,
checked by `rules.check`, chosen by extraction where cheaper, and skipped (never a failed
saturation) where an instance would not type."""

import warnings

import numpy as np
import pytest

import eqsat
from eqsat.extract.pipeline import optimize_with_report
from eqsat.ir.fused import body_signatures
from eqsat.ir.scalar_expr import parse_body
from eqsat.ir.types import DType
from eqsat.rules import Rule, check, default, op, parse, var
from eqsat.rules.compile import compile_rule

SUM_EXP = ("rule sum_exp: sum(exp(?x), axes=[1]) => "
           "map_reduce(?x, body=exp($0), reduce=sum, axes=[1])")

PROGRAM = """func @f(%x: f32[4,8], %y: f32[4]) -> (f32[4], f32[4]) {
  %e = exp %x : f32[4,8]
  %s = sum %e, axes=[1] : f32[4]
  %r = mul %s, %y : f32[4]
  return %s, %r
}"""


def _optimize(text: str, rules: eqsat.rules.RuleSet) -> tuple[eqsat.Module, eqsat.Module]:
    """The program and what `rules` make of it, with no warning and nothing kept for a note."""
    m = eqsat.parse(text)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out, report = optimize_with_report(m, rules=rules)
    assert report.notes == []
    return m, out


def _same_values(m: eqsat.Module, out: eqsat.Module) -> None:
    rng = np.random.default_rng(0)
    args = [rng.standard_normal(p.type.shape).astype(p.type.dtype.np) for p in m["f"].params]
    for a, b in zip(eqsat.interpret(m, "f", *args), eqsat.interpret(out, "f", *args)):
        np.testing.assert_allclose(a, b, rtol=1e-5)


def test_a_rule_makes_a_map_reduce_that_extraction_chooses():
    """A map_reduce on a right side was refused ('cannot be created by rules yet'): the
    e-graph had no type analysis for one."""
    rules = parse(SUM_EXP)
    check(rules)
    m, out = _optimize(PROGRAM, rules)
    assert [s.op for s in out["f"].body] == ["map_reduce", "mul"]
    assert "body=exp($0), reduce=sum, axes=[1] : f32[4]" in str(out)
    _same_values(m, out)


def test_a_map_reduce_nested_in_a_right_side_is_typed():
    rules = parse("rule scaled: mul(sum(exp(?x), axes=[1]), ?y) => "
                  "mul(map_reduce(?x, body=exp($0), reduce=sum, axes=[1]), ?y)")
    check(rules)
    m, out = _optimize(PROGRAM.replace("return %s, %r", "return %r, %r"), rules)
    assert [s.op for s in out["f"].body] == ["map_reduce", "mul"]
    _same_values(m, out)


@pytest.mark.parametrize("y", ["f32[8]", "f32[4,1]", "f32[1,8]"])
def test_the_domain_is_the_operands_broadcast_together(y):
    rules = parse("rule dot: sum(mul(?x, broadcast(?y, shape=?s)), axes=?a) => "
                  "map_reduce(?x, ?y, body=mul($0, $1), reduce=sum, axes=?a)")
    check(rules)
    m, out = _optimize(f"func @f(%x: f32[4,8], %y: {y}) -> f32[8] {{\n"
                       f"  %b = broadcast %y : f32[4,8]\n  %m = mul %x, %b : f32[4,8]\n"
                       f"  %s = sum %m, axes=[0] : f32[8]\n  return %s\n}}", rules)
    assert [s.op for s in out["f"].body] == ["map_reduce"]
    _same_values(m, out)


def test_max_of_a_kernel_and_of_a_bool_body_are_typed():
    """A bool body is typed (its signature's facts keep it from a sum), max's shape too."""
    rules = parse("rule mx: max(exp(?x), axes=?a) => "
                  "map_reduce(?x, body=exp($0), reduce=max, axes=?a)\n"
                  "rule any: max(gt(?x, ?y), axes=?a) => "
                  "map_reduce(?x, ?y, body=gt($0, $1), reduce=max, axes=?a)")
    check(rules)
    m, out = _optimize("func @f(%x: f32[4,8], %y: f32[4,8]) -> (f32[4], bool[8]) {\n"
                       "  %e = exp %x : f32[4,8]\n  %s = max %e, axes=[1] : f32[4]\n"
                       "  %g = gt %x, %y : bool[4,8]\n  %a = max %g, axes=[0] : bool[8]\n"
                       "  return %s, %a\n}", rules)
    assert [s.op for s in out["f"].body] == ["map_reduce", "map_reduce"]
    _same_values(m, out)


def test_the_rule_adds_to_the_built_in_fusion_of_the_same_kernel():
    m, out = _optimize(PROGRAM, default() + parse(SUM_EXP))
    _same_values(m, out)


@pytest.mark.parametrize("rule, program", [
    # f32 operand, f64 left side: the kernel would be f32
    ("rule f64: sum(cast(?x, dtype=f64), axes=[1]) => "
     "map_reduce(?x, body=$0, reduce=sum, axes=[1])",
     "func @f(%x: f32[4,8]) -> f64[4] {\n  %c = cast %x : f64[4,8]\n"
     "  %s = sum %c, axes=[1] : f64[4]\n  return %s\n}"),
    # the body does not type on an f32 and an f64
    ("rule mixed: sum(mul(?x, cast(?y, dtype=f32)), axes=?a) => "
     "map_reduce(?x, ?y, body=mul($0, $1), reduce=sum, axes=?a)",
     "func @f(%x: f32[4,8], %y: f64[4,8]) -> f32[4] {\n  %c = cast %y : f32[4,8]\n"
     "  %e = mul %x, %c : f32[4,8]\n  %s = sum %e, axes=[1] : f32[4]\n  return %s\n}"),
    # axes out of range, repeated, or of another shape
    ("rule far: sum(exp(?x), axes=[1]) => map_reduce(?x, body=exp($0), reduce=sum, axes=[5])",
     PROGRAM),
    ("rule twice: sum(exp(?x), axes=[1]) => map_reduce(?x, body=exp($0), reduce=sum, "
     "axes=[1,1])", PROGRAM),
    ("rule all: sum(exp(?x), axes=[1]) => map_reduce(?x, body=exp($0), reduce=sum, "
     "axes=[0,1])", PROGRAM),
    # max over an axis of length 0 has no identity
    ("rule empty: sum(exp(?x), axes=[0]) => map_reduce(?x, body=exp($0), reduce=max, "
     "axes=[0])", "func @f(%x: f32[0,3]) -> f32[3] {\n  %e = exp %x : f32[0,3]\n"
     "  %s = sum %e, axes=[0] : f32[3]\n  return %s\n}"),
])
def test_an_instance_that_would_not_type_is_skipped_and_check_names_the_rule(rule, program):
    """Unioned as a rewrite, each of these was egglog's 'Illegal merge' (optimize kept its
    input with a warning) or an ill-typed kernel extraction chose (the result did not verify)."""
    rules = parse(rule)
    m, out = _optimize(program, rules)
    assert out == m
    with pytest.raises(eqsat.UnsoundRule, match=rule.split()[1].rstrip(":")):
        check(rules)


@pytest.mark.parametrize("text, col, message", [
    ("rule r: sum(?x, axes=[0]) => map_reduce(?x, body=gt($0, 0.0), reduce=sum, axes=[0])", 30,
     r"body gt\(\$0, 0.0\) types on none of the operand dtypes the rule allows \(a sum of "
     r"bools is none\)"),
    ("rule r: sum(?x, axes=[0]) => map_reduce(?x, body=gt($0, 0.0), reduce=max, axes=[0])", 30,
     "different dtype kinds"),
    ("rule r: map_reduce(?x, body=?b, reduce=max, axes=[0]) => "
     "map_reduce(?x, body=?b, reduce=min, axes=[0])", 58, "needs its body written out"),
    ("rule r: sum(exp(?x), axes=[0]) => map_reduce(?x, body=exp($1), reduce=sum, axes=[0])", 35,
     r"\$1 is out of range"),
    ("rule r: sum(exp(?x), axes=[0]) => map_reduce(?x, body=exp($0), axes=[0])", 35,
     "needs reduce"),
])
def test_a_map_reduce_that_never_types_is_a_located_parse_error(text, col, message):
    with pytest.raises(eqsat.ParseError, match=message) as e:
        parse(text)
    assert (e.value.line, e.value.col) == (1, col)


def test_python_and_text_rules_compile_alike_and_print_back():
    text = parse(SUM_EXP)["sum_exp"]
    built = Rule("sum_exp", op.sum(op.exp(var("x")), axes=[1]),
                 op.map_reduce(var("x"), body="exp($0)", reduce="sum", axes=[1]))
    assert compile_rule(text) == compile_rule(built)
    assert str(built) == SUM_EXP and parse(str(built)).rules == (text,)
    assert "typed-union" in compile_rule(built)


def test_body_signatures_are_the_dtypes_a_body_types_on():
    def sigs(body: str, n: int) -> set[tuple[tuple[str, ...], str]]:
        return {(tuple(str(d) for d in ins), str(out))
                for ins, out in body_signatures(parse_body(body), n)}

    assert sigs("exp($0)", 1) == {(("f32",), "f32"), (("f64",), "f64")}
    assert sigs("gt($1, 0.5)", 2) == {(("None", "f32"), "bool"), (("None", "f64"), "bool")}
    assert (("bool", "i32", "i32"), "i32") in sigs("select($0, $1, $2)", 3)
    assert len(sigs("select($0, $1, $2)", 3)) == len(DType)
    assert sigs("add($0, $1)", 1) == set() and sigs("1.0", 1) == set()
