"""optimize() within its limits: tiny limits, a load or a round that outlasts the time,
exploding rules, and an ill-typed rule all leave a valid program, never costlier."""

from __future__ import annotations

import time
import warnings

import pytest

import eqsat
import eqsat.extract as ex
from eqsat.extract import optimize_with_report
from eqsat.ir import parse
from eqsat.rules import Limits, default
from eqsat.rules import parse as parse_rules
from eqsat.testing.equivalence import assert_equivalent
from optimize_helpers import EXAMPLES, assert_not_costlier, rand, same_results


def test_tiny_limits_still_give_a_valid_program_no_costlier():
    m = parse((EXAMPLES / "mlp.eqir").read_text())
    for limits in (Limits(iterations=1, nodes=1, seconds=0.01), Limits(iterations=1)):
        out, report = optimize_with_report(m, target="cuda", limits=limits)
        assert report.stop_reason in ("node limit", "iteration limit", "time limit", "saturated")
        assert_not_costlier(m, out)
        assert_equivalent(m, out, trials=3)
    assert optimize_with_report(m, limits=Limits(nodes=1))[1].rounds == 0


def test_loading_stops_at_the_time_limit_and_keeps_the_input_without_a_warning():
    """Loading counts against the time limit but ran to its end: a 1,000-op program took 2 s
    to load under Limits(seconds=0.5) and then ran no round anyway."""
    from large_programs import long_chain

    m = eqsat.differentiate(parse(long_chain(100)))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out, report = optimize_with_report(m, limits=Limits(seconds=0))
    assert out == m and report.stop_reason == "time limit" and report.enodes_initial == 0
    assert "time limit" in report.notes[0]


AC = ("rule comm: add(?x, ?y) => add(?y, ?x)\n"
      "rule assoc: add(add(?x, ?y), ?z) => add(?x, add(?y, ?z))")


def sum_chain(n: int) -> eqsat.Module:
    """@f summing n f32[16] parameters left to right."""
    params = ", ".join(f"%x{i}: f32[16]" for i in range(n))
    terms = "".join(f"  %a{i} = add %a{i - 1}, %x{i} : f32[16]\n" for i in range(2, n))
    return parse(f"module @m\nfunc @f({params}) -> f32[16] {{\n  %a1 = add %x0, %x1 : f32[16]\n"
                 f"{terms}  return %a{n - 1}\n}}\n")


def test_a_huge_node_limit_cannot_make_serializing_and_extracting_outlast_the_time_limit():
    """Serialization and extraction cannot stop halfway, so saturation stops growing the
    e-graph past what extraction's share of the time can handle: with commutativity and
    associativity on a 12-term sum, Limits(seconds=2, nodes=10**7) saturated to 193k e-nodes
    in 0.5 s and then took 7 s to serialize and extract."""
    m, ac = sum_chain(12), parse_rules(AC)
    t0 = time.perf_counter()
    out, report = optimize_with_report(m, ac, limits=Limits(iterations=1000, nodes=10**7,
                                                            seconds=2))
    took = time.perf_counter() - t0
    assert report.stop_reason == "time limit" and took < 2 + 1 + 1.5, report
    afford = ex.pipeline.extract_budget(Limits(seconds=2)) / ex.pipeline.SECONDS_PER_NODE
    assert report.enodes_final < afford
    same_results(m, out, "f", *[rand(16, seed=i) for i in range(12)])


def test_exploding_rules_stop_at_the_node_limit_and_keep_the_best_program():
    terms = " ".join(f"%a{i} = add %a{i - 1}, %x{i} : f32[16]\n" for i in range(1, 10))
    params = ", ".join(f"%x{i}: f32[16]" for i in range(10))
    m = parse(f"module @m\nfunc @f({params}) -> f32[16] {{\n  %a0 = neg %x0 : f32[16]\n"
              f"  {terms.replace(chr(10) + ' ', chr(10) + '  ')}  return %a9\n}}\n")
    ac = parse_rules(AC + "\nrule neg_neg: neg(neg(?x)) => ?x")
    t0 = time.perf_counter()
    out, report = optimize_with_report(m, ac, target="cuda", limits=Limits(nodes=3000,
                                                                           seconds=20))
    assert time.perf_counter() - t0 < 30
    assert report.stop_reason == "node limit"
    assert_not_costlier(m, out)
    same_results(m, out, "f", *[rand(16, seed=i) for i in range(10)])


def test_an_ill_typed_rule_is_skipped_where_it_does_not_type():
    """It made egglog refuse the merge: optimize kept the input with a warning. Its instance
    is skipped now (tests/test_rules_typed.py), the rest of the rule set applies."""
    m = parse("""module @m
func @f(%x: f32[8,4]) -> f32[8,4] {
  %a = neg %x : f32[8,4]
  %b = neg %a : f32[8,4]
  return %b
}
""")
    bad = parse_rules("rule bad: neg(?x) => transpose(?x, perm=[1,0])")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out, report = optimize_with_report(m, default() + bad, target="cuda")
    assert report.notes == [] and not out["f"].body


def test_a_round_that_outgrows_what_extraction_affords_keeps_the_input(monkeypatch):
    """A round predicted at a few times its input can grow the e-graph far more (a gradient's
    sums under distributivity: 12k -> 3.7M e-nodes in one round), and serializing and
    extracting that took four minutes under Limits(seconds=30); such an e-graph is not
    serialized: the input program stands, with a note."""
    m, ac = sum_chain(8), parse_rules(AC)
    limits = Limits(iterations=1, seconds=2)
    initial = optimize_with_report(m, ac, limits=limits)[1].enodes_initial
    monkeypatch.setattr(ex.pipeline, "SECONDS_PER_NODE",
                        ex.pipeline.extract_budget(limits) / initial)
    out, report = optimize_with_report(m, ac, limits=limits)
    assert report.enodes_final > 2 * initial, report
    assert out == m and "extraction can handle" in report.notes[0]


@pytest.mark.parametrize("optimize", [True, False])
def test_compile_refuses_limits_that_are_not_limits(optimize):
    """A wrong `limits` is an eqsat.Error whether or not compile optimizes (it was ignored
    with optimize=False)."""
    m = eqsat.parse("module @m\nfunc @f(%x: f32[4]) -> f32[4] {\n  %a = tanh %x : f32[4]\n"
                    "  return %a\n}")
    with pytest.raises(eqsat.Error, match="limits must be an eqsat.Limits, not int"):
        eqsat.compile(m, optimize=optimize, limits=5)
