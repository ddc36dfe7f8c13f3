"""optimize's last check: the optimized program must compute what the input does on random
inputs (eqsat/extract/validate.py), or the input is kept."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import eqsat
from call_trees import call_tree
from eqsat.extract import OptimizeWarning, optimize_with_report, pipeline, validate

ROWS = """module @m
func @f(%x: f32[6,8], %w: f32[8]) -> f32[] {{
  %r = slice %x, start=[2,0], stop=[3,8] : f32[1,8]
  %b = broadcast %w : f32[1,8]
  %p = mul {lhs}, %b : f32[1,8]
  %t = tanh %p : f32[1,8]
  %s = sum %t, axes=[0,1] : f32[]
  return %s
}}"""


def test_a_program_reading_the_wrong_value_disagrees():
    right = eqsat.parse(ROWS.format(lhs="%r"))
    wrong = eqsat.parse(ROWS.format(lhs="%b"))  # w where the row of x belongs
    assert validate.disagreement(right, right) is None
    why = validate.disagreement(right, wrong)
    assert why is not None and why.startswith("@f result 0: 1 of 1 elements differ")


def test_rounding_and_special_values_are_not_disagreement():
    a = np.float32(np.arange(1000) / 7)
    assert validate._differs(a, a * np.float32(1 + 1e-6)) is None
    # rules such as log(exp(x)) => x may turn an overflow's inf into a finite value
    assert validate._differs(np.array([np.inf, 1.0]), np.array([1e30, 1.0])) is None
    assert validate._differs(np.array([np.nan, 2.0]), np.array([0.5, 2.0])) is None
    # a near-tie comparison may flip an element or two of a bool result
    flags = np.arange(100) % 2 == 0
    flipped = flags.copy()
    flipped[:3] = ~flipped[:3]
    assert validate._differs(flags, flipped) is None
    assert "elements differ" in validate._differs(flags, ~flags)
    assert "elements differ" in validate._differs(a, a * 1.5)


def test_only_programs_cheap_to_interpret_are_checked():
    small = eqsat.parse(ROWS.format(lhs="%r"))
    big = eqsat.parse("""module @m
func @f(%x: f32[4096,1024], %w: f32[1024,1024]) -> f32[4096,1024] {
  %a = tanh %x : f32[4096,1024]
  %b = matmul %a, %w : f32[4096,1024]
  return %b
}""")
    assert validate.affordable(small, small, 5.0)
    assert not validate.affordable(big, big, 5.0)
    assert not validate.affordable(small, small, 1e-6)


def test_a_callee_is_counted_at_every_call():
    # each function looks cheap alone, but the last runs @f0 2^24 times: interpreting it took
    # minutes, and optimize ran it twice
    assert validate.affordable(eqsat.parse(call_tree(3)), eqsat.parse(call_tree(3)), 5.0)
    assert not validate.affordable(eqsat.parse(call_tree(25)), eqsat.parse(call_tree(25)), 5.0)


def test_optimize_keeps_the_input_when_its_result_disagrees(monkeypatch):
    module = eqsat.parse(ROWS.format(lhs="%r"))
    wrong = eqsat.parse(ROWS.format(lhs="%b"))
    monkeypatch.setattr(pipeline, "_extract_all", lambda *args: wrong)
    with pytest.warns(OptimizeWarning, match="disagreed with the input on random inputs"):
        out, report = optimize_with_report(module)
    assert out == module
    assert any("disagreed" in note for note in report.notes)
    assert all(r.kept_input for r in report.functions)
    assert any("internal error: please report it" in note for note in report.notes)


def test_a_disagreement_after_a_users_unsound_rule_names_the_rule_not_eqsat():
    module = eqsat.parse(ROWS.format(lhs="%r"))
    rules = eqsat.rules.default() + eqsat.rules.parse(
        "rule tanh_is_x: tanh(?x) => ?x")  # unsound: validation catches it
    with pytest.warns(OptimizeWarning, match="tanh_is_x") as caught:
        out, report = optimize_with_report(module, rules)
    assert out == module
    assert "please report" not in str(caught[0].message)
    assert "eqsat.rules.check" in report.notes[0]


def test_optimize_checks_its_result_without_a_warning_when_it_agrees():
    module = eqsat.parse(ROWS.format(lhs="%r"))
    with warnings.catch_warnings():
        warnings.simplefilter("error", OptimizeWarning)
        out, report = optimize_with_report(module)
    assert "validate" in report.seconds
    x = np.random.default_rng(0).standard_normal((6, 8)).astype(np.float32)
    w = np.random.default_rng(1).standard_normal(8).astype(np.float32)
    np.testing.assert_allclose(eqsat.interpret(out, "f", x, w),
                               eqsat.interpret(module, "f", x, w), rtol=1e-5)


def test_a_program_the_interpreter_cannot_run_is_not_judged(monkeypatch):
    module = eqsat.parse(ROWS.format(lhs="%r"))

    def refuse(*args, **kwargs):
        raise MemoryError("no room")

    monkeypatch.setattr(validate, "interpret_function", refuse)
    assert validate.disagreement(module, eqsat.parse(ROWS.format(lhs="%b"))) is None


ZERO_IN_EXACT_ARITHMETIC = """module @m
func @f(%x: f32[4,10]) -> f32[4,10] {{
  %e = exp %x : f32[4,10]
  %s = sum %e, axes=[1] : f32[4]
  %s1 = reshape %s : f32[4,1]
  %sb = broadcast %s1 : f32[4,10]
  %p = div %e, %sb : f32[4,10]
  %t = sum %p, axes=[1] : f32[4]
  %t1 = reshape %t : f32[4,1]
  %tb = broadcast %t1 : f32[4,10]
  %one = const 1.0 : f32[4,10]
  %d = sub %one, %tb : f32[4,10]
  %r = mul %p, %d : f32[4,10]
  %zero = const 0.0 : f32[4,10]
  return {result}
}}"""


def test_a_result_of_rounding_alone_may_change_but_a_wrong_value_may_not():
    # p * (1 - sum(p)) is 0 in exact arithmetic (as the gradient of sum(softmax(x)) is): the
    # input gives rounding noise, the simplified program 0, which is no disagreement
    module = eqsat.parse(ZERO_IN_EXACT_ARITHMETIC.format(result="%r"))
    assert validate.disagreement(module, module) is None
    assert validate.disagreement(module, eqsat.parse(
        ZERO_IN_EXACT_ARITHMETIC.format(result="%zero"))) is None
    wrong = eqsat.parse(ZERO_IN_EXACT_ARITHMETIC.format(result="%p"))
    assert "elements differ" in validate.disagreement(module, wrong)


FACTORED = """module @m
func @f(%x: f32[64], %y: f32[64], %z: f32[64]) -> bool[64] {{
  %a = mul %x, %y : f32[64]
  %b = mul %x, %z : f32[64]
  %c = add %a, %b : f32[64]
  %s = add %y, %z : f32[64]
  %d = mul %x, %s : f32[64]
  %e = {cmp} : bool[64]
  %t = const true : bool[64]
  return {result}
}}"""


def test_a_comparison_rounding_decides_may_change_but_a_wrong_one_may_not():
    # x*y + x*z == x*(y+z) holds in exact arithmetic; in floats it is false at random elements,
    # and where the optimizer factors both sides into one value it is true everywhere
    module = eqsat.parse(FACTORED.format(cmp="eq %c, %d", result="%e"))
    factored = eqsat.parse(FACTORED.format(cmp="eq %c, %d", result="%t"))
    assert validate.disagreement(module, factored) is None
    # x*y < x*z is no near-tie: the opposite comparison is wrong
    right = eqsat.parse(FACTORED.format(cmp="lt %a, %b", result="%e"))
    wrong = eqsat.parse(FACTORED.format(cmp="gt %a, %b", result="%e"))
    assert "elements differ" in validate.disagreement(right, wrong)
