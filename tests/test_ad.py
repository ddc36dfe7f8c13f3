"""Reverse-mode AD: every VJP rule against float64 central differences, the inner-product test
on random programs, errors (declarations and calls: test_ad_declarations.py)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import eqsat.ir as ir
from ad_helpers import check_inner_product, check_vjp, run
from eqsat.ad import VJP_RULES, differentiate
from eqsat.ad.inline import FLATTENED
from eqsat.ad.reverse import needs_rule
from eqsat.errors import VerifyError
from eqsat.ir import DType, GradDecl, Module, parse
from eqsat.ir.ops import OPS, ops_with
from eqsat.testing import default_ops, functions, modules


def one_op(params: str, body: str, result: str) -> Module:
    """A module with `@f(params) -> result { body }` (the last statement is returned)."""
    last = body.strip().splitlines()[-1].split("=")[0].strip()
    return parse(f"func @f({params}) -> {result} {{\n{body}\n  return {last}\n}}\n")


def arr(rng: np.random.Generator, shape: tuple[int, ...], low: float = -2.0,
        high: float = 2.0, away_from_zero: bool = False) -> np.ndarray:
    x = rng.uniform(low, high, shape)
    if away_from_zero:  # keep kinks (relu, abs at 0) out of the finite differences' reach
        x = np.where(np.abs(x) < 0.2, 0.5, x)
    return x


# ---------------------------------------------------------------- the table is complete


def test_every_differentiable_op_has_a_rule():
    missing = sorted(op for op in ops_with("differentiable") if needs_rule(op)
                     and op not in VJP_RULES)
    assert missing == []
    # calls are inlined and fused kernels unfused before the reverse pass (tested below)
    assert ops_with("differentiable") - set(VJP_RULES) <= FLATTENED
    assert not set(VJP_RULES) - ops_with("differentiable")


# ---------------------------------------------------------------- every rule vs central differences

POSITIVE = {"log", "sqrt", "rsqrt", "recip"}
KINKED = {"abs", "relu"}
UNARY = sorted(ir.ops.UNARY)


@pytest.mark.parametrize("op", UNARY)
def test_unary_rule(op):
    rng = np.random.default_rng(1)
    m = one_op("%x: f64[3,4]", f"  %y = {op} %x : f64[3,4]", "f64[3,4]")
    low = 0.3 if op in POSITIVE else -2.0
    check_vjp(m, "f", [arr(rng, (3, 4), low, 2.0, away_from_zero=op in KINKED)])


@pytest.mark.parametrize("op", sorted(ir.ops.BINARY))
def test_binary_rule(op):
    rng = np.random.default_rng(2)
    m = one_op("%x: f64[3,4], %y: f64[3,4]", f"  %z = {op} %x, %y : f64[3,4]", "f64[3,4]")
    x = arr(rng, (3, 4), 0.3 if op == "pow" else -2.0, 2.0)
    y = arr(rng, (3, 4), away_from_zero=op == "div")
    check_vjp(m, "f", [x, y])


def test_pow_exponent_zero_and_base_zero():
    # JAX: d/dx x^y is 0 where y == 0, even at x == 0 (no 0 * inf)
    m = one_op("%x: f64[2], %y: f64[2]", "  %z = pow %x, %y : f64[2]", "f64[2]")
    e = check_vjp(m, "f", [np.array([0.0, 1.5]), np.array([0.0, 2.0])], wrt=("x",))
    dx = run(e, "f_vjp", np.array([0.0, 1.5]), np.array([0.0, 2.0]), np.ones(2))[0]
    assert dx.tolist() == [0.0, 3.0]


@pytest.mark.parametrize("op", ["maximum", "minimum"])
def test_elementwise_extremum_ties_share(op):
    m = one_op("%x: f64[3], %y: f64[3]", f"  %z = {op} %x, %y : f64[3]", "f64[3]")
    e = vjp_module(m, ("x", "y"))
    x, y = np.array([1.0, 2.0, 3.0]), np.array([1.0, 0.0, 5.0])
    dx, dy = run(e, "f_vjp", x, y, np.full(3, 4.0))
    win_x = [2.0, 4.0, 0.0] if op == "maximum" else [2.0, 0.0, 4.0]
    assert dx.tolist() == win_x
    assert dy.tolist() == [4.0 - a for a in win_x]  # a tie gives each half


@pytest.mark.parametrize("op", ["max", "min"])
def test_reduction_ties_share(op):
    m = one_op("%x: f64[2,3]", f"  %m = {op} %x, axes=[1] : f64[2]", "f64[2]")
    e = vjp_module(m, ("x",))
    x = np.array([[1.0, 1.0, 1.0], [2.0, 0.0, 2.0]]) * (1 if op == "max" else -1)
    (dx,) = run(e, "f_vjp", x, np.array([3.0, 1.0]))
    assert np.allclose(dx, [[1.0, 1.0, 1.0], [0.5, 0.0, 0.5]])


def test_relu_and_abs_at_zero_are_zero():
    m = one_op("%x: f64[3]", "  %a = abs %x : f64[3]\n  %r = relu %x : f64[3]\n"
               "  %s = add %a, %r : f64[3]", "f64[3]")
    (dx,) = run(vjp_module(m, ("x",)), "f_vjp", np.array([-1.0, 0.0, 2.0]), np.ones(3))
    assert dx.tolist() == [-1.0, 0.0, 2.0]


def vjp_module(m: Module, wrt: tuple[str, ...], name: str = "f") -> Module:
    return differentiate(m.replace(m.items + (GradDecl(f"{name}_vjp", "vjp", name, wrt),)))


STRUCTURAL = {
    "select": ("%x: f64[3,4], %y: f64[3,4]",
               "  %c = gt %x, %y : bool[3,4]\n  %s = select %c, %x, %y : f64[3,4]", "f64[3,4]"),
    "broadcast lead+inner": ("%x: f64[3,1]", "  %b = broadcast %x : f64[2,3,4]", "f64[2,3,4]"),
    "broadcast row": ("%x: f64[4]", "  %b = broadcast %x : f64[3,4]", "f64[3,4]"),
    "broadcast scalar": ("%x: f64[]", "  %b = broadcast %x : f64[2,3]", "f64[2,3]"),
    "broadcast keeps 1": ("%x: f64[1,3,1]", "  %b = broadcast %x : f64[1,3,5]", "f64[1,3,5]"),
    "sum inner": ("%x: f64[2,3,4]", "  %s = sum %x, axes=[1] : f64[2,4]", "f64[2,4]"),
    "sum outer": ("%x: f64[2,3,4]", "  %s = sum %x, axes=[0,2] : f64[3]", "f64[3]"),
    "sum all": ("%x: f64[2,3]", "  %s = sum %x, axes=[0,1] : f64[]", "f64[]"),
    "max": ("%x: f64[3,4]", "  %s = max %x, axes=[1] : f64[3]", "f64[3]"),
    "min": ("%x: f64[3,4]", "  %s = min %x, axes=[0] : f64[4]", "f64[4]"),
    "matmul": ("%a: f64[3,4], %b: f64[4,2]", "  %c = matmul %a, %b : f64[3,2]", "f64[3,2]"),
    "matmul batch": ("%a: f64[2,3,4], %b: f64[2,4,2]", "  %c = matmul %a, %b : f64[2,3,2]",
                     "f64[2,3,2]"),
    "transpose": ("%x: f64[2,3,4]", "  %t = transpose %x, perm=[2,0,1] : f64[4,2,3]",
                  "f64[4,2,3]"),
    "reshape": ("%x: f64[2,3,4]", "  %r = reshape %x : f64[6,4]", "f64[6,4]"),
    "slice": ("%x: f64[4,5]", "  %s = slice %x, start=[1,0], stop=[3,4] : f64[2,4]", "f64[2,4]"),
    "slice 3d": ("%x: f64[3,4,2]", "  %s = slice %x, start=[0,1,1], stop=[3,3,2] : f64[3,2,1]",
                 "f64[3,2,1]"),
    "concat": ("%x: f64[2,3], %y: f64[2,1], %z: f64[2,2]",
               "  %c = concat %x, %y, %z, axis=1 : f64[2,6]", "f64[2,6]"),
    "cast f64->f32->f64": ("%x: f64[3]", "  %c = cast %x : f32[3]\n  %d = cast %c : f64[3]\n"
                           "  %e = mul %d, %x : f64[3]", "f64[3]"),
}


@pytest.mark.parametrize("case", sorted(STRUCTURAL))
def test_structural_rule(case):
    params, body, result = STRUCTURAL[case]
    m = one_op(params, body, result)
    rng = np.random.default_rng(3)
    args = [arr(rng, p.type.shape) for p in m["f"].params]
    if "cast" in case:  # an f32 in the middle: finite differences need a larger step
        check_vjp(m, "f", args, rtol=1e-3, atol=1e-4, h=1e-3)
    else:
        check_vjp(m, "f", args)


def test_integer_values_carry_no_gradient():
    m = one_op("%x: f64[3], %y: f64[3]", "  %i = cast %x : i32[3]\n  %f = cast %i : f64[3]\n"
               "  %c = lt %x, %y : bool[3]\n  %s = select %c, %f, %y : f64[3]", "f64[3]")
    e = vjp_module(m, ("x", "y"))
    x, y = np.array([0.5, 3.2, 1.0]), np.array([1.0, 1.0, 2.0])
    dx, dy = run(e, "f_vjp", x, y, np.ones(3))
    assert dx.tolist() == [0.0, 0.0, 0.0] and dy.tolist() == [0.0, 1.0, 0.0]
    assert "x.adj = const 0.0 : f64[3]" in str(e)


@pytest.mark.parametrize("dtype", ["bool", "i32"])
def test_cast_from_bool_or_int_next_to_the_seed(dtype: str):
    """A bool or integer cast to float right before the result: the seed's constant 1.0 must
    not be cast back to the operand's type (a bool constant written 1.0 did not verify)."""
    make = {"bool": "  %c = le %x, %x : bool[]\n", "i32": "  %c = cast %x : i32[]\n"}[dtype]
    m = parse(f"func @f(%x: f32[]) -> f32[] {{\n{make}  %n = cast %c : f32[]\n"
              "  %y = add %x, %n : f32[]\n  return %y\n}\nfunc @g = grad @f wrt %x\n")
    assert float(run(differentiate(m), "g", np.float32(2.5))[0]) == 1.0



@pytest.mark.parametrize("c,want", [("1e300", np.inf), ("16777217", 16777216.0)])
def test_constant_adjoint_through_f32_keeps_its_rounding(c: str, want: float):
    """The adjoint crosses f64 -> f32 -> f64: a constant one was folded through both casts
    unrounded (1e300 instead of the inf that f32 holds, and that a parameter of value 1e300
    gets)."""
    body = ("  %a = cast %x : f32[2]\n  %b = cast %a : f64[2]\n  %d = mul %b, %c : f64[2]\n"
            "  %l = sum %d, axes=[0] : f64[]\n  return %l\n}\nfunc @g = grad @f wrt %x\n")
    const = parse(f"func @f(%x: f64[2]) -> f64[] {{\n  %c = const {c} : f64[2]\n" + body)
    param = parse("func @f(%x: f64[2], %c: f64[2]) -> f64[] {\n" + body)
    x = np.ones(2)
    (got,) = run(differentiate(const), "g", x)
    (same,) = run(differentiate(param), "g", x, np.full(2, float(c)))
    assert got.tolist() == same.tolist() == [want, want]


@pytest.mark.parametrize("c,want", [("1e300", np.inf), ("16777217", 16777216.0)])
def test_constant_adjoint_cast_to_f32_holds_the_f32_value(c: str, want: float):
    """An f64 constant adjoint folded through a cast to f32 is written as the f32 it becomes:
    `const 1e+300 : f32[]` claimed a value the program never holds (and reads back as an
    overflow, which the parser refuses)."""
    m = parse(f"func @f(%x: f32[]) -> f64[] {{\n  %a = cast %x : f64[]\n"
              f"  %c = const {c} : f64[]\n  %y = mul %a, %c : f64[]\n  return %y\n}}\n"
              "func @g = grad @f wrt %x\n")
    g = differentiate(m)
    (value,) = [s.attr["value"] for s in g["g"].body if s.op == "const"]
    assert value == want
    assert parse(str(g)) == g

def test_unused_parameter_gets_a_zero_of_its_type():
    m = parse("func @f(%x: f32[], %w: f32[2,3]) -> f32[] {\n  %y = exp %x : f32[]\n"
              "  return %y\n}\nfunc @g = grad @f wrt %x, %w\n")
    g = differentiate(m)["g"]
    assert str(g.result_types[1]) == "f32[2,3]"
    assert any(s.op == "const" and s.attr["value"] == 0.0 and s.types[0] == g.result_types[1]
               for s in g.body)


def test_adjoints_of_disjoint_slices_join_into_one_concat():
    """An LSTM's gates are slices of one product: their adjoints join into one concat, with
    zeros only in the gaps (two slices here overlap: that one is added)."""
    m = one_op("%z: f64[3,12]", """  %a = slice %z, start=[0,0], stop=[3,3] : f64[3,3]
  %b = slice %z, start=[0,5], stop=[3,8] : f64[3,3]
  %c = slice %z, start=[0,6], stop=[3,9] : f64[3,3]
  %d = slice %z, start=[0,10], stop=[3,12] : f64[3,2]
  %ab = mul %a, %b : f64[3,3]
  %abc = mul %ab, %c : f64[3,3]
  %s = sum %abc, axes=[1] : f64[3]
  %t = sum %d, axes=[1] : f64[3]
  %u = mul %s, %t : f64[3]""", "f64[3]")
    rng = np.random.default_rng(5)
    vjp = check_vjp(m, "f", [arr(rng, (3, 12))])["f_vjp"]
    concats = [s for s in vjp.body if s.op == "concat"]
    widths = [[vjp.types()[o].shape[1] for o in s.operands] for s in concats]
    assert sorted(widths) == [[3, 2, 3, 2, 2], [6, 3, 3]], widths
    assert sum(s.op == "add" for s in vjp.body) == 1
    # one slice's adjoint reaching a value twice (add %x, %x) is counted twice
    twice = one_op("%x: f64[4]", """  %y = slice %x, start=[1], stop=[3] : f64[2]
  %z = add %y, %y : f64[2]""", "f64[2]")
    check_vjp(twice, "f", [arr(rng, (4,))])
    check_vjp(one_op("%x: f64[2]", """  %y = add %x, %x : f64[2]
  %z = slice %y, start=[0], stop=[1] : f64[1]""", "f64[1]"), "f", [arr(rng, (2,))])


# ---------------------------------------------------------------- random programs

SMOOTH_SETTINGS = settings(max_examples=200, deadline=None,
                           suppress_health_check=[HealthCheck.filter_too_much,
                                                  HealthCheck.too_slow])
# every differentiable op the generators can draw (not call: see the next test), and `gt` for
# select's conditions (constants are drawn on demand; more of them would make dull programs)
DIFF_OPS = sorted((ops_with("differentiable") & default_ops()) | {"gt"})


@SMOOTH_SETTINGS
@given(st.data())
def test_inner_product_on_random_programs(data):
    f = data.draw(functions(ops=DIFF_OPS, dtypes=[DType.f64], max_stmts=10))
    check_inner_product(data, Module(f), f.name)


@pytest.mark.parametrize("op", sorted(set(DIFF_OPS) - {"gt"}))
@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])
@given(data=st.data())
def test_inner_product_per_op(op, data):
    # programs of one op (and the compare a select needs), so rare ops get their share
    ops = [op, "gt"] if op == "select" else [op]
    f = data.draw(functions(ops=ops, dtypes=[DType.f64], max_stmts=6))
    check_inner_product(data, Module(f), f.name)


@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])
@given(st.data())
def test_inner_product_through_calls(data):
    m = data.draw(modules(max_functions=3, ops=DIFF_OPS + ["call"], dtypes=[DType.f64],
                          max_stmts=5))
    check_inner_product(data, m, m.items[-1].name)


# ---------------------------------------------------------------- errors


@pytest.mark.parametrize("text,message", [
    ("func @f(%x: f64[2]) -> f64[2] {\n  return %x\n}\nfunc @g = grad @f wrt %x\n",
     "one float scalar"),
    ("func @f(%x: f64[], %n: i32[]) -> f64[] {\n  return %x\n}\nfunc @g = grad @f wrt %n\n",
     "not a float type"),
])
def test_gradients_that_cannot_exist(text, message):
    m = ir.parse_module(text)
    with pytest.raises(VerifyError, match=message):
        differentiate(m)


def test_op_without_rule_is_a_clear_error(monkeypatch):
    monkeypatch.delitem(VJP_RULES, "sin")
    m = parse("func @f(%x: f64[]) -> f64[] {\n  %y = sin %x : f64[]\n  return %y\n}\n"
              "func @g = grad @f wrt %x\n")
    with pytest.raises(VerifyError, match="'sin'.*no gradient rule"):
        differentiate(m)


def test_compares_and_constants_are_not_differentiable():
    assert {"lt", "eq", "const"}.isdisjoint(ops_with("differentiable"))
    assert all(OPS[op].family in ("fused", "layout") for op in FLATTENED - {"call"})


def test_fused_kernels_are_unfused_then_differentiated():
    m = parse("""
func @f(%x: f64[2,3], %w: f64[3,4], %b: f64[4]) -> f64[2] {
  %h = matmul_epi %x, %w, %b, ta=0, tb=0, body=tanh(add($0, $1)) : f64[2,4]
  %t = matmul_t %h, %h, ta=0, tb=1 : f64[2,2]
  %s = map_reduce %t, body=mul($0, $0), reduce=sum, axes=[1] : f64[2]
  %y = map %s, body=sigmoid($0) : f64[2]
  return %y
}
""")
    rng = np.random.default_rng(8)
    e = check_vjp(m, "f", [rng.standard_normal(s) for s in ((2, 3), (3, 4), (4,))])
    assert not FLATTENED & {s.op for s in e["f_vjp"].body}
