"""assert_equivalent: passes on equal programs, fails naming the function, inputs and error."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import eqsat
import eqsat.ad
from eqsat.testing import modules
from eqsat.testing.equivalence import assert_equivalent, compare


def mod(body: str) -> eqsat.Module:
    return eqsat.parse("module @m\n" + body)


F_UNFUSED = """
func @f(%x: f32[3,4], %y: f32[3,4]) -> f32[3,4] {
  %a = add %x, %y : f32[3,4]
  %b = relu %a : f32[3,4]
  return %b
}"""
F_FUSED = """
func @f(%x: f32[3,4], %y: f32[3,4]) -> f32[3,4] {
  %b = map %x, %y, body=relu(add($0, $1)) : f32[3,4]
  return %b
}"""
F_WRONG = F_FUSED.replace("relu(", "abs(")
G_UNFUSED = """
func @g(%x: f32[3,4], %w: f32[4,2]) -> (f32[3,2], f32[]) {
  %p = matmul %x, %w : f32[3,2]
  %t = transpose %p, perm=[1,0] : f32[2,3]
  %u = transpose %t, perm=[1,0] : f32[3,2]
  %s = sum %u, axes=[0,1] : f32[]
  return %p, %s
}"""
G_OPTIMIZED = """
func @g(%x: f32[3,4], %w: f32[4,2]) -> (f32[3,2], f32[]) {
  %p = matmul %x, %w : f32[3,2]
  %s = sum %p, axes=[0,1] : f32[]
  return %p, %s
}"""
UNFUSED = mod(F_UNFUSED + G_UNFUSED)
OPTIMIZED = mod(F_FUSED + G_OPTIMIZED)


def test_equal_programs_pass():
    assert_equivalent(UNFUSED, OPTIMIZED, trials=10)
    assert_equivalent(UNFUSED, UNFUSED, trials=5)


def test_a_different_program_fails_with_function_inputs_and_error():
    wrong = mod(F_WRONG + G_OPTIMIZED)
    with pytest.raises(AssertionError) as e:
        assert_equivalent(UNFUSED, wrong, trials=20)
    msg = str(e.value)
    assert "@f differs between the modules: result 0 (f32[3,4])" in msg
    assert "largest error" in msg and "%x: f32[3,4] =" in msg and "%y: f32[3,4] =" in msg


def test_nan_in_different_places_fails():
    a = mod("""
func @f(%x: f64[5]) -> f64[5] {
  %l = log %x : f64[5]
  return %l
}""")
    b = mod("""
func @f(%x: f64[5]) -> f64[5] {
  %a = abs %x : f64[5]
  %l = log %a : f64[5]
  return %l
}""")
    with pytest.raises(AssertionError, match="NaN in different places"):
        assert_equivalent(a, b, trials=30)


def test_integer_results_must_be_exact():
    a = mod("""
func @f(%x: i32[4]) -> i32[4] {
  %y = add %x, %x : i32[4]
  return %y
}""")
    b = mod("""
func @f(%x: i32[4]) -> i32[4] {
  %y = mul %x, %x : i32[4]
  return %y
}""")
    with pytest.raises(AssertionError, match="element\\(s\\) differ; first at index"):
        assert_equivalent(a, b, trials=30)


def test_different_functions_or_signatures_fail_at_once():
    only_f = mod(F_UNFUSED)
    with pytest.raises(AssertionError, match="only in the first: \\['g'\\]"):
        assert_equivalent(UNFUSED, only_f)
    other = mod("""
func @f(%x: f32[3,4], %y: f32[3,4]) -> f32[3,4] {
  return %x
}
func @g(%x: f32[3,4], %w: f32[4,3]) -> (f32[3,3], f32[]) {
  %p = matmul %x, %w : f32[3,3]
  %s = sum %p, axes=[0,1] : f32[]
  return %p, %s
}""")
    with pytest.raises(AssertionError, match="@g has different signatures"):
        assert_equivalent(UNFUSED, other)


def test_traced_functions_compare_and_misuse_is_an_eqsat_error():
    @eqsat.function
    def f(x: eqsat.f32[4]):
        return eqsat.exp(x) * eqsat.exp(x)

    assert_equivalent(f, eqsat.optimize(f), trials=3)
    with pytest.raises(eqsat.Error, match="not str"):
        assert_equivalent(F_UNFUSED, UNFUSED)
    with pytest.raises(eqsat.Error, match="trials must be"):
        assert_equivalent(UNFUSED, UNFUSED, trials=0)


def test_gradient_declarations_are_compared_as_functions():
    src = """
func @loss(%x: f32[4,3], %w: f32[3,2]) -> f32[] {
  %p = matmul %x, %w : f32[4,2]
  %q = mul %p, %p : f32[4,2]
  %t = sum %q, axes=[0,1] : f32[]
  return %t
}
func @loss_grad = grad @loss wrt %w
"""
    m = mod(src)
    assert_equivalent(m, eqsat.ad.differentiate(m), trials=5)


def test_compare_tolerances_and_special_values():
    a = np.array([1.0, np.inf, np.nan], dtype=np.float32)
    assert compare(a, a.copy(), 1e-6, 0.0) is None
    assert compare(a, np.array([1.00001, np.inf, np.nan], np.float32), 1e-4, 0.0) is None
    assert "largest error" in compare(a, np.array([1.1, np.inf, np.nan], np.float32), 1e-4, 0.0)
    assert "infinities differ" in compare(a, np.array([1.0, -np.inf, np.nan], np.float32), 1, 1)
    assert "f32" not in (compare(a, a.astype(np.float64), 1, 1) or "f32")
    assert compare(np.float32(1.0), np.float32(2.0), 0.0, 0.5) is not None


@settings(max_examples=8, deadline=None)
@given(modules(max_functions=1), st.integers(1, 6))
def test_inside_the_callers_own_given(m, n):
    """The README's example: assert_equivalent inside a user's @given test (a nested @given
    would fail hypothesis's health check), still catching a pipeline that breaks the module."""
    assert_equivalent(m, eqsat.parse(str(m)), trials=3)
    add = eqsat.parse(f"func @f(%x: f32[{n}], %y: f32[{n}]) -> f32[{n}] {{\n"
                      f"  %z = add %x, %y : f32[{n}]\n  return %z\n}}")
    broken = eqsat.parse(str(add).replace(" add ", " sub "))  # differs wherever y != 0
    with pytest.raises(AssertionError, match="differs between the modules"):
        assert_equivalent(add, broken, trials=3, low=0.5, high=3.0)


def test_reassociated_products_agree_and_a_wrong_small_element_does_not():
    """(a@b)@c against a@(b@c) in f32: elements that cancel to near zero carry the rounding of
    the large terms they came from (per element, 29 of 50 draws at n=32 failed rtol=1e-4);
    the tolerance of a tenth of the largest result covers them, not a real difference."""
    n = 32
    t = f"f32[{n},{n}]"
    left, right = (mod(f"""
func @f(%a: {t}, %b: {t}, %c: {t}) -> {t} {{
  %p = matmul {x}, {y} : {t}
  %q = matmul {z}, {w} : {t}
  return %q
}}""") for x, y, z, w in [("%a", "%b", "%p", "%c"), ("%b", "%c", "%a", "%p")])
    assert_equivalent(left, right, trials=5)
    rng = np.random.default_rng(0)
    for _ in range(20):  # the inputs a caller's own @given gets (see _property)
        args = [rng.uniform(-3, 3, (n, n)).astype(np.float32) for _ in range(3)]
        assert compare(eqsat.interpret(left, "f", *args), eqsat.interpret(right, "f", *args),
                       1e-4, 1e-5) is None
    a, b, c = args
    want = (a @ b) @ c
    wrong = want.copy()
    wrong[3, 4] += np.float32(0.01) * np.abs(want).max()
    assert "largest error" in compare(wrong, want, 1e-4, 1e-5)
