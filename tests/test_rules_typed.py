"""User rules go through the typed step: an instance whose right side would not type as its
left side does (a different dtype or shape, operands that do not fit an op, a kernel body that
does not type on them) is skipped, never a failed saturation or an ill-typed e-node that
extraction may pick; the rule still applies where it types, and `check` reports it."""

import warnings

import numpy as np
import pytest

import eqsat
from eqsat.extract.pipeline import OptimizeWarning, optimize_with_report
from eqsat.ir.ops import OPS, OpTypeError
from eqsat.rules import Serialized, check, default, parse, saturate
from eqsat.rules.compile import compile_rule, compile_ruleset
from eqsat.rules.typing import declare_well_typed, is_well_typed
from optimize_helpers import EXAMPLES


def ill_typed_nodes(ser: Serialized) -> list[str]:
    """The e-nodes of a typed e-class, over typed operands, that their op's type rule refuses
    or types otherwise than their class: what extraction could pick into a wrong program."""
    bad = []
    for n in ser.nodes.values():
        if n.op in ("param", "const", "call") or n.eclass not in ser.types or any(
                c not in ser.types for c in n.children):
            continue
        want, op = ser.types[n.eclass], OPS[n.op]
        try:
            got = op.infer([ser.types[c] for c in n.children], dict(n.attrs),
                           want if op.written_type else None)
        except OpTypeError as e:
            bad.append(f"{n.op} {dict(n.attrs)}: {e}")
            continue
        if got != want:
            bad.append(f"{n.op} {dict(n.attrs)} gives {got} in a class of {want}")
    return bad


def _optimize(rule: str, program: str) -> tuple[eqsat.Module, eqsat.Module]:
    """The program and what the rule makes of it: no warning, no note, the same values, and
    no ill-typed e-node in the saturated e-graph."""
    m, rules = eqsat.parse(program), parse(rule)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out, report = optimize_with_report(m, rules=rules)
    assert report.notes == []
    eg, _ = saturate(m, rules)
    try:
        assert ill_typed_nodes(eg.serialize()) == []
    finally:
        eg.close()
    rng = np.random.default_rng(0)
    f = m["f"]
    args = [rng.standard_normal(p.type.shape).astype(p.type.dtype.np) if p.type.dtype.is_float
            else rng.integers(0, 2, p.type.shape).astype(p.type.dtype.np) for p in f.params]
    for a, b in zip(eqsat.interpret(m, "f", *args), eqsat.interpret(out, "f", *args)):
        np.testing.assert_allclose(a, b, rtol=1e-5)
    return m, out


def test_a_rule_applies_where_its_sides_type_alike_and_is_skipped_elsewhere():
    """`cast(?x, dtype=f32) => ?x` is an f32 value only where ?x is f32: on the f64 cast it
    was egglog's 'Illegal merge', and optimize kept the whole input with a warning."""
    m, out = _optimize("rule cast_same: cast(?x, dtype=f32) => ?x",
                       "func @f(%x: f32[4], %y: f64[4]) -> (f32[4], f32[4]) {\n"
                       "  %a = cast %x : f32[4]\n  %b = cast %y : f32[4]\n  return %a, %b\n}")
    assert [s.op for s in out["f"].body] == ["cast"] and out["f"].returns[0] == "x"


@pytest.mark.parametrize("rule, program", [
    # the sides differ in dtype, in shape: each was an 'Illegal merge'
    ("rule gt_x: gt(?x, ?y) => ?x",
     "func @f(%x: f32[4], %y: f32[4]) -> bool[4] {\n  %a = gt %x, %y : bool[4]\n  return %a\n}"),
    ("rule mm_swap: matmul(?a, ?b) => matmul(?b, ?a)",
     "func @f(%a: f32[4,8], %b: f32[8,4], %c: f32[4,4]) -> (f32[4,4], f32[4,4]) {\n"
     "  %m = matmul %a, %b : f32[4,4]\n  %n = matmul %c, %c : f32[4,4]\n  return %m, %n\n}"),
    # operands that do not fit the op: typed as the first one's, the add and the kernel were
    # unioned, extraction chose them and the result did not verify (the input was kept)
    ("rule drop_bcast: add(?x, broadcast(?y, shape=?s)) => add(?x, ?y)",
     "func @f(%x: f32[4,8], %y: f32[8], %z: f32[4,8]) -> (f32[4,8], f32[4,8]) {\n"
     "  %b = broadcast %y : f32[4,8]\n  %a = add %x, %b : f32[4,8]\n"
     "  %c = broadcast %z : f32[4,8]\n  %d = add %x, %c : f32[4,8]\n  return %a, %d\n}"),
    ("rule fuse_add: add(?x, cast(?y, dtype=f32)) => map(?x, ?y, body=add($0, $1), like=?x)",
     "func @f(%x: f32[4,8], %y: f64[4,8]) -> f32[4,8] {\n"
     "  %c = cast %y : f32[4,8]\n  %a = add %x, %c : f32[4,8]\n  return %a\n}"),
    ("rule sel_cond: select(gt(?a, ?b), ?x, ?y) => select(?a, ?x, ?y)",
     "func @f(%a: f32[4], %b: f32[4], %x: f32[4], %y: f32[4]) -> f32[4] {\n"
     "  %c = gt %a, %b : bool[4]\n  %s = select %c, %x, %y : f32[4]\n  return %s\n}"),
    ("rule log_int: neg(?x) => log(?x)",
     "func @f(%x: i32[4]) -> i32[4] {\n  %a = neg %x : i32[4]\n  return %a\n}"),
])
def test_an_instance_that_would_not_type_is_skipped(rule, program):
    m, out = _optimize(rule, program)
    assert out == m


def test_a_kernel_a_rule_makes_is_typed_by_its_body():
    """The map where the body types (f32 and f32) is made; the one over f32 and f64 is not.
    A matmul_epi is typed by its body too (its dtype was never derived: the rule could not
    have unioned it through the typed step)."""
    _, out = _optimize("rule fuse_add: add(?x, cast(?y, dtype=f32)) => "
                       "map(?x, ?y, body=add($0, $1), like=?x)",
                       "func @f(%x: f32[4,8], %y: f64[4,8], %z: f32[4,8]) -> (f32[4,8], f32[4,8]) "
                       "{\n  %c = cast %y : f32[4,8]\n  %a = add %x, %c : f32[4,8]\n"
                       "  %e = cast %z : f32[4,8]\n  %d = add %x, %e : f32[4,8]\n"
                       "  return %a, %d\n}")
    assert [s.op for s in out["f"].body] == ["cast", "add", "map"]
    _, out = _optimize("rule epi: relu(add(matmul(?a, ?b), ?c)) => "
                       "matmul_epi(?a, ?b, ?c, ta=0, tb=0, body=relu(add($0, $1)))",
                       "func @f(%a: f32[64,32], %b: f32[32,64], %c: f32[64,64]) -> f32[64,64] {\n"
                       "  %m = matmul %a, %b : f32[64,64]\n  %s = add %m, %c : f32[64,64]\n"
                       "  %r = relu %s : f32[64,64]\n  return %r\n}")
    assert [s.op for s in out["f"].body] == ["matmul_epi"]


def test_only_rules_not_declared_well_typed_take_the_typed_step():
    """The built-in rules type alike on both sides wherever their left side does (check
    verifies it on every instance): plain rewrites, which the typed step would slow by a
    fifth to a third on small programs."""
    user = parse("rule r: neg(neg(?x)) => ?x")["r"]
    assert "typed-union" in compile_rule(user) and "(union " not in compile_rule(user)
    assert not is_well_typed(user)
    for rule in default():
        assert is_well_typed(rule) and "typed-union" not in compile_rule(rule)
    assert all(is_well_typed(r) for r in parse(str(default())))


def test_a_rule_wrongly_declared_well_typed_still_fails_loudly():
    """Without the typed step an ill-typed instance is egglog's 'Illegal merge': optimize keeps
    the input with a warning that names the rule."""
    bad = declare_well_typed(parse("rule bad_declared: neg(?x) => transpose(?x, perm=[1,0])"))
    m = eqsat.parse("func @f(%x: f32[8,4]) -> f32[8,4] {\n  %a = neg %x : f32[8,4]\n"
                    "  return %a\n}")
    with pytest.warns(OptimizeWarning, match="different types.*bad_declared"):
        out, report = optimize_with_report(m, bad)
    assert out == m and report.functions[0].kept_input
    assert "eqsat.rules.check" in str(report)


@pytest.mark.parametrize("rule, message", [
    # ill-typed on some instances: named with one, and what optimize does with it
    ("rule cast_same: cast(?x, dtype=f32) => ?x",
     r"cast_same: the right-hand side is ill-typed: it gives f\d\d\[.*\] where the left-hand "
     r"side gives f32.*\n  counterexample: .*\n  optimize skips such an instance"),
    # ill-typed on every instance: the rule never applies
    ("rule never: transpose(?x, perm=[1,0]) => broadcast(?x, shape=[8,4])",
     r"rule never never applies: its two sides type together on none of the instances drawn"
     r".*cannot broadcast"),
    # unsound where it types (bools), ill-typed elsewhere: the values come first
    ("rule gt_x: gt(?x, ?y) => ?x",
     r"rule gt_x is unsound: .*\n  counterexample: \?x = bool"),
])
def test_check_tells_ill_typed_never_typed_and_unsound_rules_apart(rule, message):
    with pytest.raises(eqsat.UnsoundRule, match=message):
        check(parse(rule))


def test_a_rule_kept_to_where_it_types_by_a_condition_passes_check():
    rules = parse("rule cast_same: cast(?x, dtype=f32) => ?x if dtype(?x) == f32")
    check(rules)
    _optimize(str(rules), "func @f(%x: f32[4], %y: f64[4]) -> (f32[4], f32[4]) {\n"
                          "  %a = cast %x : f32[4]\n  %b = cast %y : f32[4]\n"
                          "  return %a, %b\n}")


@pytest.mark.parametrize("text, col", [
    ("rule r: exp(map(?x, body=?b, shape=?s, dtype=?d)) => "
     "exp(map(?x, body=?b, shape=?s, dtype=?d))", 58),
    ("rule r: matmul_epi(?a, ?b, ta=0, tb=0, body=?e) => "
     "matmul_epi(?a, ?b, ta=0, tb=0, body=?e)", 52),
])
def test_a_kernel_made_by_a_rule_needs_its_body_written_out(text, col):
    """The e-graph types a kernel a rule makes by its body; one bound on the left may not type
    on the right side's operands, and the typed step could never union it."""
    with pytest.raises(eqsat.ParseError, match="needs its body written out") as e:
        parse(text)
    assert (e.value.line, e.value.col) == (1, col)


@pytest.mark.parametrize("rule, program", [
    # axes repeated, out of range, over an empty axis for max: typed as if the bad axes were
    # not there, each right side had the left side's type and joined its e-class
    ("rule twice: sum(?x, axes=[1]) => sum(?x, axes=[1,1])",
     "func @f(%x: f32[4,8]) -> f32[4] {\n  %s = sum %x, axes=[1] : f32[4]\n  return %s\n}"),
    ("rule far: sum(?x, axes=[1]) => sum(?x, axes=[1,5])",
     "func @f(%x: f32[4,8]) -> f32[4] {\n  %s = sum %x, axes=[1] : f32[4]\n  return %s\n}"),
    ("rule empty: sum(?x, axes=[0]) => max(?x, axes=[0])",
     "func @f(%x: f32[0,3]) -> f32[3] {\n  %s = sum %x, axes=[0] : f32[3]\n  return %s\n}"),
    # a perm that is no permutation: [1,1] permutes a square's shape to itself
    ("rule perm: transpose(?x, perm=[1,0]) => transpose(?x, perm=[1,1])",
     "func @f(%x: f32[4,4]) -> f32[4,4] {\n  %t = transpose %x, perm=[1,0] : f32[4,4]\n"
     "  return %t\n}"),
    # a slice past the end: its stop less its start was the left side's shape
    ("rule past: transpose(?x, perm=[1,0]) => "
     "slice(transpose(?x, perm=[1,0]), start=[4,0], stop=[12,4])",
     "func @f(%x: f32[4,8]) -> f32[8,4] {\n  %t = transpose %x, perm=[1,0] : f32[8,4]\n"
     "  return %t\n}"),
    # a reshape of another element count, a broadcast against numpy's rule: their written
    # shape was the left side's (extraction chose the broadcast: the result did not verify)
    ("rule count: reshape(?x, shape=?s) => reshape(sum(?x, axes=[0]), shape=?s)",
     "func @f(%x: f32[4,8]) -> f32[32] {\n  %r = reshape %x : f32[32]\n  return %r\n}"),
    ("rule bcast: transpose(?x, perm=[1,0]) => broadcast(?x, shape=[8,4])",
     "func @f(%x: f32[4,8]) -> f32[8,4] {\n  %t = transpose %x, perm=[1,0] : f32[8,4]\n"
     "  return %t\n}"),
    # a concat of another dtype: typed as its first operand's
    ("rule cat: concat(?x, cast(?y, dtype=f32), axis=0) => concat(?x, ?y, axis=0)",
     "func @f(%x: f32[2,4], %y: f64[2,4]) -> f32[4,4] {\n  %c = cast %y : f32[2,4]\n"
     "  %r = concat %x, %c, axis=0 : f32[4,4]\n  return %r\n}"),
])
def test_a_core_op_whose_literal_attributes_do_not_fit_the_instance_is_skipped(rule, program):
    m, out = _optimize(rule, program)
    assert out == m


def test_the_built_in_rules_leave_no_ill_typed_node():
    """Their instances skip the typed step: every node they make must type as its e-class."""
    for name in ("mlp", "transformer"):
        m = eqsat.differentiate(eqsat.parse((EXAMPLES / f"{name}.eqir").read_text()))
        eg, _ = saturate(m, default())
        try:
            assert ill_typed_nodes(eg.serialize()) == []
        finally:
            eg.close()


def test_a_skipped_right_side_that_matches_the_rule_again_does_not_grow_the_e_graph():
    """The right side of a skipped instance stays in the e-graph, untyped; it is itself a
    `transpose(?x, perm=[1,0])`, and the rule matched it in the next round, and the next:
    one term a round until the iteration limit. Only a typed left side is matched now."""
    m = eqsat.parse("func @f(%x: f32[4,8]) -> f32[8,4] {\n"
                    "  %t = transpose %x, perm=[1,0] : f32[8,4]\n  return %t\n}")
    rule = parse("rule r: transpose(?x, perm=[1,0]) => "
                 "transpose(sum(?x, axes=[7]), perm=[1,0])")
    eg, report = saturate(m, rule)
    eg.close()
    assert report.stop_reason == "saturated" and len(report.rounds) <= 2, report


def test_a_well_typed_rule_does_not_union_a_skipped_term_into_a_typed_class():
    """`mul_one` met the untyped f32[4] * f32[1] that `r`'s skipped instance left and
    unioned it with ?x: an ill-typed node in a typed e-class (the fusion pass even fused it)."""
    m = eqsat.parse("func @f(%x: f32[4]) -> f32[4] {\n  %a = neg %x : f32[4]\n  return %a\n}")
    rules = default() + parse("rule r: neg(?x) => neg(mul(?x, const(1.0, shape=[1], dtype=f32)))")
    eg, report = saturate(m, rules)
    try:
        assert ill_typed_nodes(eg.serialize()) == [] and report.fired["mul_one"] == 0
    finally:
        eg.close()


def test_a_set_of_well_typed_rules_compiles_to_plain_rewrites():
    """No rule of such a set leaves an untyped term, so none needs the guard on a typed left
    side, which made egglog's push and pop of a kept e-graph 0.6 ms slower: a third of a
    small program's saturation is that push and pop."""
    program = compile_ruleset(default())
    assert "(shape _root)" not in program and "typed-union" not in program
    assert program.count("(rewrite ") == len(default())
    mixed = compile_ruleset(default() + parse("rule r: neg(neg(?x)) => ?x"))
    assert mixed.count("(= _rs (shape _root))") == len(default()) + 1


@pytest.mark.parametrize("rhs, ops", [
    ("matmul_t(?a, ?b, ta=1, tb=0)", ["matmul_t"]),
    ("matmul_epi(?a, ?b, ta=1, tb=0, body=$0)", ["matmul_epi"]),
    ("matmul_t(?a, ?b, ta=0, tb=1)", ["transpose", "matmul"]),  # the dims do not fit
    ("matmul_t(?a, ?b, ta=2, tb=0)", ["transpose", "matmul"]),  # no flag
])
def test_a_transposed_product_a_rule_makes_is_typed_by_its_flags(rhs, ops):
    _, out = _optimize(f"rule mine: matmul(transpose(?a, perm=[1,0]), ?b) => {rhs}",
                       "func @f(%a: f32[8,4], %b: f32[8,6]) -> f32[4,6] {\n"
                       "  %t = transpose %a, perm=[1,0] : f32[4,8]\n"
                       "  %m = matmul %t, %b : f32[4,6]\n  return %m\n}")
    assert [s.op for s in out["f"].body] == ops


def test_a_rule_set_is_compiled_once_until_a_rule_of_it_is_declared_well_typed(monkeypatch):
    """The built-in set's program cost ~5 ms of every optimize: the same rules (the same
    tuple, which `default()` hands out) compile once; declaring a rule of the set well-typed
    afterwards gives the program of the rules as they are now."""
    import eqsat.rules.compile as compile_mod

    mine = parse("rule mine_twice: neg(neg(?x)) => ?x")
    first = compile_ruleset(default())
    mixed = compile_ruleset(mine)
    calls = []
    real = compile_mod.compile_rule
    monkeypatch.setattr(compile_mod, "compile_rule", lambda *a: calls.append(a) or real(*a))
    assert compile_ruleset(default()) == first and compile_ruleset(mine) == mixed
    assert calls == []
    for i in range(compile_mod.KEEP_PROGRAMS):  # others come and go; the one in use stays
        compile_ruleset(parse(f"rule other{i}: neg(neg(?x)) => ?x"))
        assert compile_ruleset(default()) == first
    assert len(calls) == compile_mod.KEEP_PROGRAMS
    calls.clear()
    declare_well_typed(mine)
    plain = compile_ruleset(mine)
    assert plain != mixed and "(rewrite " in plain and len(calls) == 1


def _saturated(module: eqsat.Module, checks: bool) -> Serialized:
    from eqsat.rules import Limits, load, saturate_egraph

    rules = default()
    program = compile_ruleset(rules)
    eg = load(module, rules=program, checks=checks)
    try:
        saturate_egraph(eg, rules, Limits(seconds=float("inf")), program=program)
        return eg.serialize()
    finally:
        eg.close()


@pytest.mark.parametrize("example", ["mlp", "transformer"])
def test_the_unchecked_analysis_types_what_the_checking_one_does(example):
    """For a set of well-typed rules (the built-in ones) the analysis computes types without
    checking the op type rules: every term such a set and the fusion pass make types. The
    saturated e-graph is the same, class for class and type for type."""
    m = eqsat.differentiate(eqsat.parse((EXAMPLES / f"{example}.eqir").read_text()))
    checked, unchecked = _saturated(m, True), _saturated(m, False)
    assert _signature(unchecked) == _signature(checked) and ill_typed_nodes(unchecked) == []


def _signature(ser: Serialized) -> tuple:
    """The e-graph up to the ids egglog gave its classes: each node as its op, attributes,
    its class's type and its operands' types (None: untyped), and each class's type."""
    from collections import Counter

    nodes = Counter((n.op, repr(n.attrs), ser.types.get(n.eclass),
                     tuple(ser.types.get(c) for c in n.children)) for n in ser.nodes.values())
    classes = Counter(ser.types.get(c) for c in ser.classes)
    roots = {f: [ser.types.get(c) for c in cs] for f, cs in ser.roots.items()}
    return nodes, classes, roots
