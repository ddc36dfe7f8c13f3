"""Conditions that compare with a literal int list (`shape(?x) == [4, 4]`, `?p != [1, 0]`):
parsed, checked, compiled to egglog and drawn by `rules.check`."""

import pytest

import eqsat
from eqsat.rules import Limits, Rule, check, parse, saturate
from eqsat.rules.compile import compile_rule
from eqsat.rules.lang import Cond, Fn, Var

LIFT = "rule lift: exp(?x) => map(?x, body=exp($0), like=?x) if "

SRC = """func @f(%x: f32[4,4], %y: f32[2,3], %z: f32[]) -> (f32[4,4], f32[2,3], f32[]) {
  %a = exp %x : f32[4,4]
  %b = exp %y : f32[2,3]
  %c = exp %z : f32[]
  return %a, %b, %c
}"""


def _lifted(cond: str) -> list[str]:
    """The shapes of the exp e-classes that the lifting rule guarded by `cond` gave a map."""
    eg, _ = saturate(eqsat.parse(SRC), parse(LIFT + cond), Limits(iterations=3))
    ser = eg.serialize()
    return sorted(str(ser.types[n.eclass]) for n in ser.nodes.values() if n.op == "map")


@pytest.mark.parametrize("cond, lifted", [
    ("shape(?x) == [4, 4]", ["f32[4,4]"]),
    ("[2,3] == shape(?x)", ["f32[2,3]"]),
    ("shape(?x) != [4,4]", ["f32[2,3]", "f32[]"]),
    ("shape(?x) == []", ["f32[]"]),
    ("shape(?x) != []", ["f32[2,3]", "f32[4,4]"]),
])
def test_shape_compared_with_a_list_guards_the_rewrite(cond, lifted):
    """A list literal in a condition was a parse error ('expected a condition term')."""
    assert _lifted(cond) == lifted


def test_an_attribute_variable_compares_with_a_list():
    m = eqsat.parse("func @f(%x: f32[2,3,4]) -> (f32[3,2,4], f32[2,4,3]) {\n"
                    "  %a = transpose %x, perm=[1,0,2] : f32[3,2,4]\n"
                    "  %b = transpose %x, perm=[0,2,1] : f32[2,4,3]\n  return %a, %b\n}")
    rs = parse("rule neg2: transpose(?x, perm=?p) => neg(neg(transpose(?x, perm=?p))) "
               "if ?p == [0,2,1]")
    eg, report = saturate(m, rs, Limits(iterations=1))
    ser = eg.serialize()
    assert report.fired["neg2"] == 1
    assert next(str(ser.types[n.eclass]) for n in ser.nodes.values() if n.op == "neg") == \
        "f32[2,4,3]"


def test_list_conditions_print_and_build_alike_in_python_and_text():
    text = parse("rule t: transpose(?x, perm=?p) => ?x if ?p == [0,1], shape(?x) != [2, 2]")
    built = Rule("t", "transpose(?x, perm=?p)", "?x", "?p == [0,1], shape(?x) != [2,2]")
    conds = Rule("t", "transpose(?x, perm=?p)", "?x",
                 [Cond("==", Var("p"), [0, 1]), Cond("!=", Fn("shape", Var("x")), (2, 2))])
    assert str(text["t"]) == str(built) == str(conds) == \
        "rule t: transpose(?x, perm=?p) => ?x if ?p == [0,1], shape(?x) != [2,2]"
    assert compile_rule(text["t"]) == compile_rule(built) == compile_rule(conds)
    assert "(vec-of 0 1)" in compile_rule(built) and "(vec-of 2 2)" in compile_rule(built)
    assert parse(str(text)).rules == text.rules


@pytest.mark.parametrize("cond, col, message", [
    ("shape(?x) == [4, ]", 48, "expected an integer, got ']'"),
    ("shape(?x) == [4 4]", 47, "expected ',' or ']', got '4'"),
    ("shape(?x) == [4, 4", 49, "expected ',' or ']', got end of line"),
    ("shape(?x) == [", 45, "expected an integer, got end of line"),
    ("shape(?x) == [4, ?y]", 48, r"expected an integer, got '\?y'"),
    ("shape(?x) == [1.5]", 45, "expected an integer, got '1.5'"),
    ("shape(?x) < [4,4]", 31, "compares integers only"),
    ("rank(?x) == [2]", 31, "compares an integer with an int list"),
    ("dtype(?x) == [4]", 31, "compares a dtype with an int list"),
    ("shape(?x) == [-1, 2]", 31, "can never hold: a shape's dims are >= 0"),
    ("shape(?x) == [4, 99999999999999999999]", 31, "64-bit"),
])
def test_malformed_list_conditions_are_located(cond, col, message):
    with pytest.raises(eqsat.ParseError, match=message) as e:
        parse("rule r: exp(?x) => exp(?x) if " + cond)
    assert (e.value.line, e.value.col) == (1, col)


@pytest.mark.parametrize("term", [[4, True], 2.5, "f16"])
def test_python_conditions_with_no_condition_term_are_parse_errors(term):
    with pytest.raises(eqsat.ParseError, match="a condition compares"):
        Rule("r", "exp(?x)", "?x", [Cond("==", Fn("shape", Var("x")), term)])


@pytest.mark.parametrize("text", [
    "rule sq: transpose(?x, perm=[1,0]) => ?x if shape(?x) == [1, 1]",
    "rule cm: add(?x, ?y) => add(?y, ?x) if shape(?y) == [4, 5]",
    "rule ident: transpose(?x, perm=?p) => ?x if ?p == [0,1,2,3,4,5]",
    "rule big: sum(?x, axes=?a) => sum(?x, axes=[1]) if ?a == [1], shape(?x) == [7, 90, 2]",
    "rule sc: exp(?x) => exp(?x) if shape(?x) == []",
])
def test_check_draws_what_a_list_condition_fixes(text):
    """Shapes were drawn with dims 1 to 3 and ranks to 4, so a condition fixing a shape or an
    attribute to a list was met by chance at best (CheckError: no instance)."""
    check(parse(text), examples=20)


def test_check_finds_counterexamples_at_the_shape_a_list_fixes():
    with pytest.raises(eqsat.UnsoundRule, match=r"\?x = float(32|64)\[4, 4\]"):
        check(parse("rule bad: transpose(?x, perm=[1,0]) => ?x if shape(?x) == [4, 4]"))


def test_check_says_when_a_fixed_shape_is_too_large_to_draw():
    with pytest.raises(eqsat.rules.CheckError, match=r"fixes \?x's shape to \[1024,1024\] "
                       r"\(1048576 elements\)"):
        check(parse("rule r: exp(?x) => exp(?x) if shape(?x) == [1024, 1024]"))
    with pytest.raises(eqsat.rules.CheckError, match="no instance satisfies"):
        check(parse("rule r: transpose(?x, perm=[1,0]) => ?x if shape(?x) == [2, 3, 4]"),
              examples=3)


def test_an_indexed_shape_reads_as_dim():
    """`shape(?x)[0]` is how numpy code reads a dim; it was a parse error ('expected a
    comparison')."""
    rs = parse("rule r: matmul(?a, ?b) => matmul(?a, ?b) if shape(?a)[-1] == shape(?b)[0], "
               "shape(?a)[0] >= 64")
    assert str(rs["r"]).endswith("if dim(?a, -1) == dim(?b, 0), dim(?a, 0) >= 64")
    with pytest.raises(eqsat.ParseError, match="takes one integer index") as e:
        parse("rule r: exp(?x) => exp(?x) if shape(?x)[0, 1] == 2")
    assert (e.value.line, e.value.col) == (1, 42)
