"""Fused-kernel and layout ops as IR: their table entries and traits, body expressions and
their literals, text round trips, and the verifier's and parser's located diagnostics."""

from __future__ import annotations

import numpy as np
import pytest

import eqsat
from eqsat.extract import optimize_with_report
from eqsat.ir import Function, Module, Param, Stmt
from eqsat.ir.fused import unfuse_module
from eqsat.ir.ops import CORE_OPS, ELEMENTWISE, OPS, ops_with
from eqsat.ir.scalar_expr import (MAX_DEPTH, App, Arg, Lit, body_op_names, format_body,
                                  operand_roles, parse_body)

from fused_helpers import GOLDEN


# ---------------------------------------------------------------- the table


def test_ops_are_registered_with_traits():
    assert {"map", "map_reduce", "matmul_epi"} <= ops_with("fused")
    assert "matmul_t" in ops_with("layout")
    assert not {"map", "map_reduce", "matmul_t", "matmul_epi"} & CORE_OPS
    assert OPS["map"].written_type and not OPS["map_reduce"].written_type
    for name in ("map", "map_reduce", "matmul_t", "matmul_epi"):
        assert OPS[name].doc


def test_body_ops_come_from_the_table():
    allowed = body_op_names()
    assert allowed == {n for n in ELEMENTWISE if not OPS[n].written_type}
    assert {"tanh", "add", "gt", "select"} <= allowed
    assert not allowed & {"cast", "map", "matmul", "sum"}


def test_operand_roles_are_probed_from_the_type_rules():
    assert operand_roles("select") == ((True, False, False), True)
    assert operand_roles("lt") == ((False, False), False)
    assert operand_roles("add") == ((False, False), True)
    assert operand_roles("exp") == ((False,), True)


# ---------------------------------------------------------------- text


def test_golden_text_round_trips():
    m = eqsat.parse(GOLDEN)
    assert str(m) == GOLDEN
    again = eqsat.parse(str(m))
    assert again == m and hash(again) == hash(m)


def test_python_built_statements_equal_parsed_ones():
    t = eqsat.f32[4, 8]
    body = App("tanh", (App("add", (App("mul", (Arg(0), Arg(1))), Lit(0.5))),))
    stmts = (
        Stmt(("y",), "map", ("x", "w"), (("body", body),), (t,)),
        Stmt(("s",), "map_reduce", ("x",), (("body", App("exp", (Arg(0),))),
                                            ("reduce", "max"), ("axes", [0])), (eqsat.f32[8],)),
    )
    f = Function("f", (Param("x", t), Param("w", eqsat.f32[8])), (t, eqsat.f32[8]), stmts,
                 ("y", "s"))
    m = Module(f, name="built")
    text = str(m)
    assert "%y = map %x, %w, body=tanh(add(mul($0, $1), 0.5)) : f32[4,8]" in text
    assert "%s = map_reduce %x, body=exp($0), reduce=max, axes=[0] : f32[8]" in text
    assert eqsat.parse(text) == m
    eqsat.verify(m)


def test_literals_compare_by_their_text():
    assert Lit(float("nan")) == Lit(float("nan"))
    assert hash(Lit(float("nan"))) == hash(Lit(float("nan")))
    assert Lit(-0.0) != Lit(0.0) and Lit(1) != Lit(1.0) and Lit(True) != Lit(1)
    assert Lit(np.float32(0.5)) == Lit(0.5)
    for text in ("add($0, -0.0)", "select(false, $1, nan)", "maximum($0, -inf)", "mul($0, 1e-05)",
                 "sub(7, $2)", "neg(-3)"):
        assert format_body(parse_body(text)) == text
    with pytest.raises(TypeError):
        Lit("0.5")
    with pytest.raises(ValueError):
        Arg(-1)


def test_an_integer_literal_in_a_float_body_is_that_float():
    # `add($0, 1)` on f32 was refused (while `const 1 : f32[]` is 1.0), and a user rule
    # writing such a body loaded but never fired on a float program
    m = eqsat.parse("""module @m
func @f(%x: f32[4]) -> f32[4] {
  %y = map %x, body=add(mul($0, 2), 1) : f32[4]
  return %y
}""")
    assert eqsat.parse(str(m)) == m
    unfused = unfuse_module(m)
    assert [s.attr["value"] for s in unfused["f"].body if s.op == "const"] == [2.0, 1.0]
    assert eqsat.parse(str(unfused)) == unfused
    x = np.array([0.0, 1.5, -2.0, 3.0], np.float32)
    np.testing.assert_array_equal(eqsat.interpret(m, "f", x), x * 2 + 1)
    np.testing.assert_array_equal(eqsat.compile(m, optimize=False).f(x), x * 2 + 1)
    doubling = eqsat.rules.parse("rule dbl: add(?x, ?x) => map(?x, body=mul($0, 2), like=?x)")
    plain = eqsat.parse("""module @m
func @f(%x: f32[4], %y: f32[4]) -> f32[4] {
  %a = add %x, %x : f32[4]
  %b = mul %a, %y : f32[4]
  return %b
}""")
    _, report = optimize_with_report(plain, eqsat.rules.default() + doubling)
    assert report.fired["dbl"] >= 1


def test_a_body_unpickled_in_another_process_hashes_as_built_there():
    # App keeps its hash; a pickled one carried its maker's, and a str's hash differs between
    # processes, so equal bodies missed each other in dicts and sets
    import pickle
    import subprocess
    import sys

    script = ("import pickle, sys\nfrom eqsat.ir.scalar_expr import parse_body\n"
              "sys.stdout.buffer.write(pickle.dumps(parse_body('tanh(add($0, $1))')))")
    made = subprocess.run([sys.executable, "-c", script], capture_output=True, check=True).stdout
    here = parse_body("tanh(add($0, $1))")
    there = pickle.loads(made)
    assert there == here and hash(there) == hash(here) and there in {here}
    assert there.reads == frozenset({0, 1})


def test_body_nesting_limit():
    ok = "neg(" * (MAX_DEPTH - 1) + "$0" + ")" * (MAX_DEPTH - 1)
    assert format_body(parse_body(ok)) == ok
    text = (f"func @f(%x: f32[2]) -> f32[2] {{\n  %y = map %x, body=neg({ok}) : f32[2]\n"
            "  return %y\n}\n")
    with pytest.raises(eqsat.ParseError, match="nested deeper") as info:
        eqsat.parse(text)
    assert info.value.line == 2


def test_deep_python_built_body_is_a_verify_error():
    body: App | Arg = Arg(0)
    for _ in range(5000):
        body = App("neg", (body,))
    t = eqsat.f32[2]
    f = Function("f", (Param("x", t),), (t,), (Stmt(("y",), "map", ("x",), (("body", body),),
                                                    (t,)),), ("y",))
    with pytest.raises(eqsat.VerifyError, match="nested deeper"):
        eqsat.verify(Module(f))


def test_malformed_python_built_body_is_a_verify_error():
    t = eqsat.f32[2]
    f = Function("f", (Param("x", t),), (t,),
                 (Stmt(("y",), "map", ("x",), (("body", "tanh"),), (t,)),), ("y",))
    with pytest.raises(eqsat.VerifyError, match="must be a body expression"):
        eqsat.verify(Module(f))


# ---------------------------------------------------------------- diagnostics

HEADER = ("module @e\n\nfunc @f(%x: f32[4], %w: f32[4], %c: bool[4], %s: f32[3], %i: i32[4], "
          "%a: f32[3,5], %m: f32[5,2], %r: f32[2,3], %v: f32[2]) -> f32[4] {\n")

BAD = [
    # statement, error class, where the column points (a substring of the statement), message
    ("%y = map %x, %w, body=add($0, $5) : f32[4]", eqsat.VerifyError, "body", "$5 is out of range"),
    ("%y = map %x, body=add($0, foo($0)) : f32[4]", eqsat.ParseError, "foo", "unknown op 'foo'"),
    ("%y = map %x, body=tahn($0) : f32[4]", eqsat.ParseError, "tahn", "did you mean 'tanh'"),
    ("%y = map %x, %w, body=matmul($0, $1) : f32[4]", eqsat.ParseError, "matmul",
     "cannot appear in a body"),
    ("%y = map %x, body=add($0) : f32[4]", eqsat.VerifyError, "body",
     "add takes 2 operand(s), got 1"),
    ("%y = map %x, %w, body=select($0, $1, $1) : f32[4]", eqsat.VerifyError, "body",
     "condition must be bool"),
    ("%y = map %x, %w, body=add(gt($0, $1), $0) : f32[4]", eqsat.VerifyError, "body",
     "one type, got bool"),
    ("%y = map %c, body=exp($0) : f32[4]", eqsat.VerifyError, "body", "float operand"),
    ("%y = map %x, body=gt($0, 0.0) : f32[4]", eqsat.VerifyError, "body",
     "computes bool, but the result type says f32"),
    ("%y = map %i, body=add($0, 3000000000) : i32[4]", eqsat.VerifyError, "body",
     "does not fit in i32"),
    ("%y = map %i, body=add($0, 1.5) : i32[4]", eqsat.VerifyError, "body", "integer literal"),
    ("%y = map %x, body=select(gt(1.0, 2.0), $0, $0) : f32[4]", eqsat.VerifyError, "body",
     "nothing fixes the dtype"),
    ("%y = map %x, %s, body=add($0, $1) : f32[4]", eqsat.VerifyError, "%s", "does not broadcast"),
    ("%y = map body=1.0 : f32[4]", eqsat.VerifyError, "%y", "at least one operand"),
    ("%y = map %x, body=add($0, $0 : f32[4]", eqsat.ParseError, ":", "expected ')' or ','"),
    ("%y = map %x, body=add(%x, $0) : f32[4]", eqsat.ParseError, "%x, $0",
     "expected a body expression"),
    ("%y = map_reduce %x, body=$0, reduce=prod, axes=[0] : f32[]", eqsat.ParseError, "prod",
     "expected a reduction"),
    ("%y = map_reduce %x, body=$0, reduce=sum, axes=[1] : f32[]", eqsat.VerifyError, "axes",
     "axis 1 is out of range"),
    ("%y = map_reduce %x, body=gt($0, 0.0), reduce=sum, axes=[0] : f32[]", eqsat.VerifyError,
     "reduce=", "sum needs a numeric body"),
    ("%y = map_reduce %x, %s, body=add($0, $1), reduce=sum, axes=[0] : f32[]", eqsat.VerifyError,
     "%s", "does not broadcast with"),
    ("%y = matmul_t %a, %m, ta=2, tb=0 : f32[3,2]", eqsat.VerifyError, "ta", "ta is 0 or 1"),
    ("%y = matmul_t %a, %m, ta=1, tb=0 : f32[5,2]", eqsat.VerifyError, "%m", "inner dimensions"),
    ("%y = matmul_epi %a, %m, %r, ta=0, tb=0, body=add($0, $1) : f32[3,2]", eqsat.VerifyError,
     "%r", "does not broadcast to the result"),
    ("%y = matmul_epi %a, %m, %v, ta=0, tb=0, body=add($0, $2) : f32[3,2]", eqsat.VerifyError,
     "body", "$2 is out of range"),
    ("%y = matmul_epi %a, ta=0, tb=0, body=$0 : f32[3,2]", eqsat.VerifyError, "%y",
     "needs two operands"),
]


@pytest.mark.parametrize("stmt, error, marker, message", BAD)
def test_bad_statements_are_located(stmt, error, marker, message):
    text = HEADER + "  " + stmt + "\n  return %x\n}\n"
    with pytest.raises(error) as info:
        eqsat.parse(text)
    assert type(info.value) is error and message in str(info.value), str(info.value)
    assert (info.value.line, info.value.col) == (4, 3 + stmt.index(marker)), str(info.value)


def test_the_op_table_is_read_once_per_body(monkeypatch):
    from eqsat.ir import scalar_expr

    calls = []
    real = scalar_expr.body_op_names
    monkeypatch.setattr(scalar_expr, "body_op_names", lambda: calls.append(1) or real())
    text = "tanh(add(mul($0, $1), neg(exp(sub($0, 0.5)))))"  # six ops applied
    body = scalar_expr.parse_body(text)
    assert len(calls) == 1  # parsing reads the table of allowed ops once, not once per op
    f32 = eqsat.ir.DType.f32
    assert scalar_expr.check_body(body, [f32, f32]) == f32
    assert len(calls) == 2  # typing too: the fusion pass types thousands of such bodies
