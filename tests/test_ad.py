"""Reverse-mode AD: every VJP rule against float64 central differences, the inner-product test
on random programs, declarations of declarations, calls, names, errors."""

from __future__ import annotations

import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import eqsat.ir as ir
from ad_helpers import check_vjp, inner_product_gap, run
from eqsat.ad import VJP_RULES, differentiate
from eqsat.ad.inline import FLATTENED
from eqsat.ad.reverse import needs_rule
from eqsat.errors import VerifyError
from eqsat.ir import DType, GradDecl, Module, parse
from eqsat.ir.ops import OPS, ops_with
from eqsat.testing import default_ops, functions, modules

F64 = DType.f64


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

def test_unused_parameter_gets_a_zero_of_its_type():
    m = parse("func @f(%x: f32[], %w: f32[2,3]) -> f32[] {\n  %y = exp %x : f32[]\n"
              "  return %y\n}\nfunc @g = grad @f wrt %x, %w\n")
    g = differentiate(m)["g"]
    assert str(g.result_types[1]) == "f32[2,3]"
    assert any(s.op == "const" and s.attr["value"] == 0.0 and s.types[0] == g.result_types[1]
               for s in g.body)


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
    _inner_product(data, Module(f), f.name)


@pytest.mark.parametrize("op", sorted(set(DIFF_OPS) - {"gt"}))
@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])
@given(data=st.data())
def test_inner_product_per_op(op, data):
    # programs of one op (and the compare a select needs), so rare ops get their share
    ops = [op, "gt"] if op == "select" else [op]
    f = data.draw(functions(ops=ops, dtypes=[DType.f64], max_stmts=6))
    _inner_product(data, Module(f), f.name)


@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])
@given(st.data())
def test_inner_product_through_calls(data):
    m = data.draw(modules(max_functions=3, ops=DIFF_OPS + ["call"], dtypes=[DType.f64],
                          max_stmts=5))
    _inner_product(data, m, m.items[-1].name)


def _inner_product(data, m: Module, name: str) -> None:
    f = m[name]
    assume(any(p.type.dtype.is_float for p in f.params))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    args = [rng.uniform(0.2, 1.5, p.type.shape) * rng.choice([-1.0, 1.0], p.type.shape)
            if p.type.dtype.is_float else rng.integers(-3, 4, p.type.shape).astype(p.type.dtype.np)
            for p in f.params]
    args = [a.astype(p.type.dtype.np) for a, p in zip(args, f.params)]
    gap = inner_product_gap(m, name, args, rng)
    assume(gap is not None)
    lhs, rhs, scale = gap
    assert abs(lhs - rhs) <= 1e-5 * (abs(lhs) + abs(rhs) + 1.0), (lhs, rhs, str(m))


# ---------------------------------------------------------------- declarations, calls, names

MLP = """
func @predict(%x: f64[3,4], %w: f64[4,2], %b: f64[2]) -> f64[3,2] {
  %0 = matmul %x, %w : f64[3,2]
  %1 = broadcast %b : f64[3,2]
  %2 = add %0, %1 : f64[3,2]
  %3 = tanh %2 : f64[3,2]
  return %3
}

func @loss(%x: f64[3,4], %w: f64[4,2], %b: f64[2], %y: f64[3,2]) -> f64[] {
  %p = call @predict(%x, %w, %b) : f64[3,2]
  %d = sub %p, %y : f64[3,2]
  %s = mul %d, %d : f64[3,2]
  %t = sum %s, axes=[0,1] : f64[]
  return %t
}

func @loss_grad = grad @loss wrt %w, %b
func @loss_vg = value_and_grad @loss wrt %w
func @hvp = vjp @loss_grad wrt %w
"""


def mlp_args(rng):
    return [rng.standard_normal(s) for s in ((3, 4), (4, 2), (2,), (3, 2))]


def test_differentiate_expands_every_declaration_and_keeps_functions():
    m = parse(MLP)
    d = differentiate(m)
    assert [it.name for it in d.items] == [it.name for it in m.items]
    assert not d.grad_decls
    assert d["predict"] == m["predict"] and d["loss"] == m["loss"]
    assert parse(str(d)) == d
    assert all(s.op != "call" for s in d["loss_grad"].body)


def test_grad_and_value_and_grad_match_central_differences():
    rng = np.random.default_rng(4)
    m = parse(MLP)
    args = mlp_args(rng)
    check_vjp(m, "loss", args, wrt=("w", "b"))
    d = differentiate(m)
    gw, gb = run(d, "loss_grad", *args)
    value, gw2 = run(d, "loss_vg", *args)
    assert value == run(m, "loss", *args)[0]
    assert np.array_equal(gw, gw2)


def test_hessian_vector_product_matches_differences_of_the_gradient():
    rng = np.random.default_rng(5)
    d = differentiate(parse(MLP))
    x, w, b, y = mlp_args(rng)
    v, u = rng.standard_normal(w.shape), rng.standard_normal(b.shape)
    (hv,) = run(d, "hvp", x, w, b, y, v, u)
    h = 1e-5
    # d/dw <(v, u), grad(w)> along the direction e for every element e of w
    want = np.zeros_like(w)
    for j in np.ndindex(w.shape):
        wp, wm = w.copy(), w.copy()
        wp[j] += h
        wm[j] -= h
        gp, gm = run(d, "loss_grad", x, wp, b, y), run(d, "loss_grad", x, wm, b, y)
        want[j] = (np.sum(v * (gp[0] - gm[0])) + np.sum(u * (gp[1] - gm[1]))) / (2 * h)
    np.testing.assert_allclose(hv, want, rtol=1e-6, atol=1e-8)


def test_calls_twice_parameter_returns_and_several_results():
    m = parse("""
func @pair(%a: f64[3], %b: f64[3]) -> (f64[3], f64[3]) {
  %p = mul %a, %b : f64[3]
  return %p, %a
}
func @f(%x: f64[3], %y: f64[3]) -> f64[3] {
  %u, %v = call @pair(%x, %y) : f64[3], f64[3]
  %s, %t = call @pair(%u, %v) : f64[3], f64[3]
  %r = sin %s : f64[3]
  %q = add %r, %t : f64[3]
  return %q
}
""")
    rng = np.random.default_rng(6)
    e = check_vjp(m, "f", [rng.standard_normal(3), rng.standard_normal(3)])
    body = e["f_vjp"].body
    assert [s.results[0] for s in body[:2]] == ["u", "s"]  # callee values take the caller's names


def test_functions_may_call_declarations():
    m = parse(MLP + """
func @step(%x: f64[3,4], %w: f64[4,2], %b: f64[2], %y: f64[3,2]) -> f64[4,2] {
  %gw, %gb = call @loss_grad(%x, %w, %b, %y) : f64[4,2], f64[2]
  %lr = const 0.1 : f64[]
  %l = broadcast %lr : f64[4,2]
  %d = mul %gw, %l : f64[4,2]
  %n = sub %w, %d : f64[4,2]
  return %n
}
""")
    rng = np.random.default_rng(7)
    e = check_vjp(m, "step", mlp_args(rng), wrt=("w",))
    assert isinstance(e["step_vjp"], ir.Function) and isinstance(e["loss_grad"], ir.Function)


def test_calls_deeper_than_the_recursion_limit():
    # Each function calls the one before: inlining ran recursively and hit RecursionError.
    depth = sys.getrecursionlimit() + 100
    funcs = ["func @f0(%x: f64[2]) -> f64[2] {\n  return %x\n}"]
    funcs += [f"func @f{i}(%x: f64[2]) -> f64[2] {{\n  %y = call @f{i - 1}(%x) : f64[2]\n"
              f"  %z = add %y, %x : f64[2]\n  return %z\n}}" for i in range(1, depth)]
    m = parse("\n".join(funcs) + f"\nfunc @g = vjp @f{depth - 1} wrt %x\n")
    seed = np.array([1.0, -2.0])
    (gx,) = run(differentiate(m), "g", np.zeros(2), seed)
    np.testing.assert_array_equal(gx, depth * seed)



def test_a_declaration_built_in_python_reads_one_wrt_name_as_one_parameter():
    # wrt="xy" was split into its letters: a silent gradient w.r.t. %x and %y.
    m = parse("func @f(%x: f64[], %y: f64[], %xy: f64[]) -> f64[] {\n"
              "  %a = mul %x, %xy : f64[]\n  %b = mul %a, %y : f64[]\n  return %b\n}\n")
    d = differentiate(m.replace(m.items + (GradDecl("g", "grad", "f", "xy"),)))
    assert d["g"].returns == ("xy.adj",)
    assert run(d, "g", np.float64(2.0), np.float64(3.0), np.float64(5.0)) == [6.0]

def test_seed_names_never_clash_with_values():
    m = parse("func @f(%x: f64[2]) -> f64[2] {\n  %seed.0 = exp %x : f64[2]\n"
              "  return %seed.0\n}\nfunc @v = vjp @f wrt %x\n")
    d = differentiate(m)
    assert [p.name for p in d["v"].params] == ["x", "seed.0"]
    x = np.array([0.5, -1.0])
    assert np.allclose(run(d, "v", x, np.array([1.0, 2.0]))[0], np.exp(x) * [1.0, 2.0])


GOLDEN = """\
func @f(%x: f32[4], %w: f32[4]) -> f32[] {
  %y = mul %x, %w : f32[4]
  %t = tanh %y : f32[4]
  %l = sum %t, axes=[0] : f32[]
  return %l
}

func @df = grad @f wrt %w
"""

GOLDEN_DF = """\
func @df(%x: f32[4], %w: f32[4]) -> f32[4] {
  %y = mul %x, %w : f32[4]
  %t = tanh %y : f32[4]
  %t.adj = const 1.0 : f32[4]
  %t.bwd = mul %t, %t : f32[4]
  %y.adj = sub %t.adj, %t.bwd : f32[4]
  %w.adj = mul %y.adj, %x : f32[4]
  return %w.adj
}"""


README_MLP = """
func @predict(%x: f32[8,4], %w: f32[4,3], %b: f32[3]) -> f32[8,3] {
  %0 = matmul %x, %w : f32[8,3]
  %1 = broadcast %b : f32[8,3]
  %2 = add %0, %1 : f32[8,3]
  %3 = relu %2 : f32[8,3]
  return %3
}

func @loss(%x: f32[8,4], %w: f32[4,3], %b: f32[3], %y: f32[8,3]) -> f32[] {
  %p = call @predict(%x, %w, %b) : f32[8,3]
  %d = sub %p, %y : f32[8,3]
  %s = mul %d, %d : f32[8,3]
  %t = sum %s, axes=[0,1] : f32[]
  %n = const 0.041666668 : f32[]
  %l = mul %t, %n : f32[]
  return %l
}

func @loss_grad = grad @loss wrt %w, %b
"""

README_MLP_GRAD = """\
func @loss_grad(%x: f32[8,4], %w: f32[4,3], %b: f32[3], %y: f32[8,3]) -> (f32[4,3], f32[3]) {
  %predict.0 = matmul %x, %w : f32[8,3]
  %predict.1 = broadcast %b : f32[8,3]
  %predict.2 = add %predict.0, %predict.1 : f32[8,3]
  %p = relu %predict.2 : f32[8,3]
  %d = sub %p, %y : f32[8,3]
  %s.adj = const 0.041666668 : f32[8,3]
  %d.adj.1 = mul %s.adj, %d : f32[8,3]
  %d.adj = add %d.adj.1, %d.adj.1 : f32[8,3]
  %zero = const 0.0 : f32[8,3]
  %p.bwd = gt %predict.2, %zero : bool[8,3]
  %predict.2.adj = select %p.bwd, %d.adj, %zero : f32[8,3]
  %b.adj = sum %predict.2.adj, axes=[0] : f32[3]
  %predict.0.bwd = transpose %x, perm=[1,0] : f32[4,8]
  %w.adj = matmul %predict.0.bwd, %predict.2.adj : f32[4,3]
  return %w.adj, %b.adj
}"""


def test_golden_adjoint_text():
    d = differentiate(parse(GOLDEN))
    assert "\n".join(ir.printer.format_function(d["df"])) == GOLDEN_DF


def test_golden_readme_example():
    # the README's example: a call inlined, relu, un-broadcasting of the bias, matmul
    d = differentiate(parse(README_MLP))
    assert "\n".join(ir.printer.format_function(d["loss_grad"])) == README_MLP_GRAD


def test_generated_code_has_no_trivial_arithmetic():
    d = differentiate(parse(MLP))
    for fn in d.functions:
        consts = {s.results[0]: s.attr["value"] for s in fn.body if s.op == "const"}
        for s in fn.body:
            if s.op in ("add", "sub"):
                assert consts.get(s.operands[1]) != 0.0 and (s.op == "sub" or
                                                            consts.get(s.operands[0]) != 0.0)
            if s.op == "mul":
                assert 1.0 not in (consts.get(s.operands[0]), consts.get(s.operands[1]))
        # primal values are reused: no statement of the primal is computed twice
        keys = [(s.op, s.operands, s.attrs, s.types) for s in fn.body]
        assert len(keys) == len(set(keys))


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
