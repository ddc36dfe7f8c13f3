"""optimize() keeps the sign of zeros where numpy's results show it (through a reciprocal,
-inf against inf): identities that would flip it are left out or written exactly."""

from __future__ import annotations

from collections import Counter

import numpy as np

import eqsat
from eqsat import interpret
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
