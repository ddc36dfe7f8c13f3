"""optimize() keeps the sign of zeros where numpy's results show it (through a reciprocal,
-inf against inf): identities that would flip it are left out or written exactly."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

import eqsat
from eqsat import interpret
from eqsat.backend.matmul_kernels import blas_pays, gemm_pays
from eqsat.backend.narrow_matmul import narrow_pays
from eqsat.extract import optimize
from eqsat.ir import parse


def test_signed_zeros_survive_optimization():
    """x + 0.0 is not x (at x = -0.0 it is +0.0), 0.0 - x is not -x (at x = +0.0), and the
    constants -0.0 and 0.0 stay apart (egglog's f64 equality does not tell them apart): each
    shows through a reciprocal as -inf against inf."""
    m = parse("""module @m
func @f(%x: f64[2]) -> (f64[2], f64[2], f64[2], f64[2]) {
  %p = const 0.0 : f64[2]
  %n = const -0.0 : f64[2]
  %a = add %x, %p : f64[2]
  %b = sub %p, %x : f64[2]
  %c = mul %x, %n : f64[2]
  %d = mul %x, %p : f64[2]
  %ra = recip %a : f64[2]
  %rb = recip %b : f64[2]
  %rc = recip %c : f64[2]
  %rd = recip %d : f64[2]
  return %ra, %rb, %rc, %rd
}
""")
    out = optimize(m)
    x = np.array([-0.0, 0.0])
    for got, want in zip(interpret(out, "f", x), interpret(m, "f", x)):
        np.testing.assert_array_equal(np.signbit(got), np.signbit(want))
        np.testing.assert_array_equal(got, want)
    assert Counter(s.op for s in optimize(parse("""module @m
func @f(%x: f32[8]) -> f32[8] {
  %n = const -0.0 : f32[8]
  %a = add %x, %n : f32[8]
  return %a
}
"""))["f"].body)["add"] == 0  # x + (-0.0) is x exactly


def test_negated_sum_keeps_the_sign_of_an_exact_zero():
    """-x + -y is +0.0 where y = -x; neg_add rewrote it to -(x + y), which is -0.0, so a
    reciprocal after it gave -inf where numpy gives +inf."""
    m = eqsat.parse("""func @f(%x: f32[3], %y: f32[3]) -> f32[3] {
  %a = neg %x : f32[3]
  %b = neg %y : f32[3]
  %s = add %a, %b : f32[3]
  %r = recip %s : f32[3]
  return %r
}""")
    x = np.array([1.0, 2.5, 0.0], np.float32)
    want = eqsat.interpret(m, "f", x, -x)
    np.testing.assert_array_equal(eqsat.interpret(eqsat.optimize(m), "f", x, -x), want)
    np.testing.assert_array_equal(eqsat.compile(m)("f", x, -x), want)


def test_ieee_rules_keep_numpys_values_at_inf_where_distributivity_does_not():
    # a*b + a*c at a = inf, b = 1, c = 0 is inf + NaN = NaN; factored, a*(b + c) is inf
    m = eqsat.parse("func @f(%a: f32[4], %b: f32[4], %c: f32[4]) -> f32[4] {\n"
                    "  %p = mul %a, %b : f32[4]\n  %q = mul %a, %c : f32[4]\n"
                    "  %s = add %p, %q : f32[4]\n  return %s\n}")
    a, b, c = (np.full(4, v, np.float32) for v in (np.inf, 1.0, 0.0))
    want = eqsat.interpret(m, "f", a, b, c)
    assert np.isnan(want).all()
    factored = eqsat.optimize(m)
    assert np.isinf(eqsat.interpret(factored, "f", a, b, c)).all()  # README: fast-math-like
    exact = eqsat.optimize(m, rules=eqsat.rules.default(ieee=True))
    assert np.isnan(eqsat.interpret(exact, "f", a, b, c)).all()
    assert np.isnan(eqsat.compile(exact, optimize=False).f(a, b, c)).all()


# (shape, axes) of each max/min reduction: lanes, tails, inner and outer axes, and a column
# reduction large enough to be cut into parts that threads share (backend/reductions.py)
_REDUCTIONS = [((7,), [0]), ((3, 5), [0]), ((3, 5), [1]), ((3, 5), [0, 1]), ((4, 5, 6), [0, 2]),
               ((64, 33), [1]), ((4096, 1024), [0])]


def _extremum_inputs(shape: tuple[int, ...], dtype: type, rng: np.random.Generator) -> np.ndarray:
    """Values whose max and min are zeros of both signs in some places, only -0.0 in others,
    NaN in others: each slice of every axis meets all three."""
    x = -np.abs(rng.standard_normal(shape)).astype(dtype)  # max is a zero where one is
    x[rng.random(shape) < 0.2] = -0.0
    x[rng.random(shape) < 0.2] = 0.0
    flat = x.reshape(-1)
    flat[::97] = np.nan
    flat[: flat.size // 3] = -0.0  # whole slices of -0.0 alone
    return x


@pytest.mark.parametrize("dtype", ["f32", "f64"])
def test_compiled_max_and_min_are_numpys_up_to_the_sign_of_tied_zeros(dtype: str) -> None:
    """Compiled maximum/minimum and max/min reductions against the interpreter (numpy): NaN
    wherever numpy's, the same values, and the same zeros, sign included, except where a
    reduction meets +0.0 and -0.0 both, whose sign numpy leaves to the order it reads them
    in (README). Elementwise ties give the second operand, as numpy's."""
    rng = np.random.default_rng(5)
    np_dtype = np.dtype({"f32": np.float32, "f64": np.float64}[dtype]).type
    lines, results, params, args, cases = [], [], [], [], []
    for k, (shape, axes) in enumerate(_REDUCTIONS):
        ty = f"{dtype}[{','.join(map(str, shape))}]"
        kept = f"{dtype}[{','.join(str(d) for i, d in enumerate(shape) if i not in axes)}]"
        params.append(f"%x{k}: {ty}")
        args.append(_extremum_inputs(shape, np_dtype, rng))
        for op, sign in (("max", 1), ("min", -1)):
            source = f"%x{k}" if sign > 0 else f"%n{k}"
            if sign < 0:
                lines.append(f"  %n{k} = neg %x{k} : {ty}")
            lines.append(f"  %{op}{k} = {op} {source}, axes={axes} : {kept}")
            results.append((f"%{op}{k}", kept))
            cases.append((sign * args[-1], tuple(axes)))
    x, y = (np.where(rng.random((4, 65)) < 0.5, 0.0, -0.0).astype(np_dtype) for _ in "xy")
    x[0, ::5], y[1, ::7] = np.nan, np.nan
    ty = f"{dtype}[4,65]"
    params += [f"%a: {ty}", f"%b: {ty}"]
    args += [x, y]
    for op in ("maximum", "minimum"):
        lines += [f"  %{op}_ab = {op} %a, %b : {ty}", f"  %{op}_ba = {op} %b, %a : {ty}"]
        results += [(f"%{op}_ab", ty), (f"%{op}_ba", ty)]
    m = parse(f"func @f({', '.join(params)}) -> ({', '.join(t for _, t in results)}) {{\n"
              + "\n".join(lines) + f"\n  return {', '.join(n for n, _ in results)}\n}}")
    got = eqsat.compile(m, optimize=False)("f", *args)
    want = interpret(m, "f", *args)
    for k, (g, w) in enumerate(zip(got, want)):
        np.testing.assert_array_equal(g, w)  # NaN where numpy's, and equal values
        shown = ~np.isnan(w)  # a NaN's sign bit means nothing
        if k < len(cases):
            terms, axes = cases[k]
            zero = terms == 0
            both = (np.any(zero & np.signbit(terms), axis=axes)
                    & np.any(zero & ~np.signbit(terms), axis=axes))
            shown &= ~(both & (w == 0))
        np.testing.assert_array_equal(np.signbit(g)[shown], np.signbit(w)[shown])
    assert all(np.signbit(w).any() for w in want[-4:])  # the elementwise ties are in the test


@pytest.mark.parametrize("dtype, tiny", [("f32", 1e-30), ("f64", 1e-200)])
@pytest.mark.parametrize("m, k, n", [(1, 1, 1), (3, 5, 2), (8, 8, 40), (128, 128, 128)])
def test_a_matmul_underflowing_to_zero_equals_numpys_and_keeps_the_products_sign(
        dtype: str, tiny: float, m: int, k: int, n: int) -> None:
    """Every product -tiny * tiny underflows: numpy's zeros are +0.0 or -0.0 as its OpenBLAS
    kernel for the size has it (README), the generated kernels' (narrow, small, packed GEMM)
    are -0.0, fused multiply-adds from +0.0 keeping the sign of the negative products. Both
    compare equal, as np.array_equal and == do."""
    t = lambda r, c: f"{dtype}[{r},{c}]"  # noqa: E731
    mod = parse(f"func @f(%a: {t(m, k)}, %b: {t(k, n)}) -> {t(m, n)} {{\n"
                f"  %c = matmul %a, %b : {t(m, n)}\n  return %c\n}}")
    np_dtype = np.float32 if dtype == "f32" else np.float64
    a, b = np.full((m, k), -tiny, np_dtype), np.full((k, n), tiny, np_dtype)
    got = eqsat.compile(mod, optimize=False)("f", a, b)
    assert np.array_equal(got, interpret(mod, "f", a, b)) and not got.any()
    out = mod["f"].result_types[0]
    if gemm_pays(out, k) or narrow_pays(out) or not blas_pays(out, k):  # generated code
        assert np.signbit(got).all()
