"""Nothing a user types makes eqsat raise anything but eqsat.Error, hang or recurse."""

from __future__ import annotations

import re
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import eqsat
from eqsat.errors import Error, ParseError, VerifyError
from eqsat.ir import Function, Module, Param, Stmt, TensorType, interpret, parse, verify
from eqsat.ir.module import Names
from eqsat.ir.types import DType
from eqsat.testing import modules

FUZZ = settings(max_examples=300, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow])
TOKEN = re.compile(r"\s+|[%@][A-Za-z0-9_.]+|->|-?[A-Za-z0-9_.+]+|.", re.S)
# What a confused or hostile user might splice into a program.
JUNK = ["%x", "%0", "@f", "@nope", ",", ":", "=", "(", ")", "[", "]", "{", "}", "->", "func",
        "return", "module", "f32[]", "f32[2,3]", "i64[99999999999999999999]", "bool[0]", "0",
        "-1", "1e999", "nan", "-inf", "true", "add", "call", "const", "sum", "axes=[0]",
        "perm=[1,0]", "axis=7", "start=[0]", "stop=[9]", "body=add($0, $1)", "map", "\n", "#",
        "grad", "wrt", "vjp", "\x00", "é", "9" * 500]


def parse_or_error(text: str | bytes) -> Module | None:
    """Parse; only eqsat's own errors may escape. A module that parses must round-trip."""
    try:
        m = parse(text)
    except Error as e:
        assert isinstance(e, (ParseError, VerifyError)), type(e)
        return None
    assert parse(str(m)) == m
    return m


def small(m: Module) -> bool:
    return all(t.size <= 10_000 for f in m.functions for t in f.types().values())


@FUZZ
@given(st.binary(max_size=300))
def test_random_bytes(data: bytes):
    parse_or_error(data)


@FUZZ
@given(st.text(max_size=300))
def test_random_text(text: str):
    parse_or_error(text)


@FUZZ
@given(st.data())
def test_mutated_programs(data: st.DataObject):
    text = str(data.draw(modules(max_functions=2, max_stmts=5)))
    tokens = TOKEN.findall(text)
    for _ in range(data.draw(st.integers(1, 4))):
        kind = data.draw(st.sampled_from(["delete", "insert", "swap", "char"]))
        i = data.draw(st.integers(0, len(tokens) - 1))
        if kind == "delete" and len(tokens) > 1:
            del tokens[i]
        elif kind == "insert":
            tokens.insert(i, data.draw(st.sampled_from(JUNK)))
        elif kind == "swap":
            j = data.draw(st.integers(0, len(tokens) - 1))
            tokens[i], tokens[j] = tokens[j], tokens[i]
        else:
            tok = tokens[i]
            k = data.draw(st.integers(0, len(tok)))
            tokens[i] = tok[:k] + data.draw(st.characters()) + tok[k + 1:]
    m = parse_or_error("".join(tokens))
    if m is not None and small(m):
        # A mutant that still verifies must interpret (or fail with an eqsat error).
        for f in m.functions:
            args = [np.zeros(p.type.shape, p.type.dtype.np) for p in f.params]
            try:
                interpret(m, f.name, *args)
            except Error:
                pass


def test_empty_and_blank_text():
    for text in ("", " ", "\n\n", "# only a comment\n", b""):
        m = parse(text)
        assert len(m) == 0 and parse(str(m)) == m


@pytest.mark.parametrize("junk", [b"\xff\xfe\x00", b"\x80abc", bytes(range(256)), b"\x00" * 50])
def test_binary_garbage_is_a_parse_error(junk: bytes):
    with pytest.raises(ParseError):
        parse(junk)


@pytest.mark.parametrize("t", [
    "f32[99999999999999999999]",
    "f32[" + ",".join(["2"] * 40) + "]",
    "f32[1073741824,1073741824]",  # 2^60 elements
    "i64[4294967296,4294967296,4]",
    "f32[-3]",
])
def test_absurd_types_are_verify_errors(t: str):
    with pytest.raises(VerifyError) as e:
        parse(f"func @f(%x: {t}) -> f32[] {{\n  %c = const 0.0 : f32[]\n  return %c\n}}\n")
    assert (e.value.line, e.value.col) == (1, 13)
    with pytest.raises(VerifyError):
        parse(f"func @f() -> f32[] {{\n  %c = const 0.0 : {t}\n  %d = const 0.0 : f32[]\n"
              f"  return %d\n}}\n")


def test_absurd_type_built_in_python_is_a_verify_error():
    t = TensorType(DType.f32, (2**31, 2**31))
    f = Function("f", (Param("x", t),), (t,), (), ("x",))
    with pytest.raises(VerifyError):
        verify(Module(f))


def test_allocation_too_large_for_memory_is_an_interpret_error():
    m = parse("func @f() -> f32[16777216,16777216] {\n"
              "  %c = const 1.0 : f32[16777216,16777216]\n  return %c\n}\n")
    with pytest.raises(eqsat.InterpretError):
        interpret(m, "f")


@pytest.mark.parametrize("body, result", [
    ("  %c = const 1.0 : f32[16777216,16777216]\n  return %c", "f32[16777216,16777216]"),
    ("  %c = const 1.0 : f32[16777216,16777216]\n  %s = sum %c, axes=[0,1] : f32[]\n"
     "  return %s", "f32[]"),
], ids=["result", "arena"])
def test_compiled_call_too_large_for_memory_is_an_interpret_error(body: str, result: str):
    exe = eqsat.compile(parse(f"func @f() -> {result} {{\n{body}\n}}\n"), optimize=False)
    with pytest.raises(eqsat.InterpretError, match="out of memory calling @f"):
        exe.f()


def chain_text(n: int) -> str:
    ops = ["add %{p}, %x", "mul %{p}, %x", "tanh %{p}", "neg %{p}", "maximum %{p}, %x"]
    lines = ["func @f(%x: f32[4]) -> f32[4] {", "  %v0 = neg %x : f32[4]"]
    for i in range(1, n):
        lines.append(f"  %v{i} = " + ops[i % len(ops)].format(p=f"v{i - 1}") + " : f32[4]")
    return "\n".join(lines + [f"  return %v{n - 1}", "}", ""])


def test_a_5000_op_chain_is_quick():
    text = chain_text(5000)
    start = time.perf_counter()
    m = parse(text)
    assert str(m).count("\n") > 5000 and parse(str(m)) == m
    out = interpret(m, "f", np.linspace(-1, 1, 4, dtype=np.float32))
    elapsed = time.perf_counter() - start
    assert out.shape == (4,) and np.isfinite(out).all()
    assert elapsed < 5.0, f"parse + verify + print + interpret took {elapsed:.1f} s"



def test_fresh_names_of_one_base_take_linear_time():
    """The gradient of a chain that reads one parameter n times names n contributions
    `%x.adj.sum`, `%x.adj.sum.1`, ...: each fresh name scanned from `.1` up, so naming alone
    took 2.5 s of the 4.7 that differentiating an 8,000-op chain took."""
    names = Names({"a.2"})
    start = time.perf_counter()
    got = [names.fresh("a") for _ in range(20000)]
    assert time.perf_counter() - start < 2.0
    assert got[:4] == ["a", "a.1", "a.3", "a.4"] and len(set(got)) == 20000

def test_a_2000_deep_call_chain_does_not_recurse():
    lines = ["func @f0(%x: f64[2]) -> f64[2] {", "  %y = neg %x : f64[2]", "  return %y", "}"]
    for i in range(1, 2000):
        lines += [f"func @f{i}(%x: f64[2]) -> f64[2] {{",
                  "  %z = neg %x : f64[2]", f"  %y = call @f{i - 1}(%z) : f64[2]",
                  "  return %y", "}"]
    start = time.perf_counter()
    m = parse("\n".join(lines) + "\n")
    assert parse(str(m)) == m
    out = interpret(m, "f1999", np.array([1.0, -2.0]))
    np.testing.assert_array_equal(out, [1.0, -2.0])  # 2000 negations
    assert time.perf_counter() - start < 10.0


@pytest.mark.parametrize("text,line,col", [
    ("func @f(%x: f32[]) -> f32[] {\n  %y = call @g(%x) : f32[]\n  return %y\n}\n"
     "func @g(%x: f32[]) -> f32[] {\n  %y = call @f(%x) : f32[]\n  return %y\n}\n", 6, 13),
    ("func @f(%x: f32[]) -> f32[] {\n  %y = call @f(%x) : f32[]\n  return %y\n}\n", 2, 13),
])
def test_recursion_is_refused(text: str, line: int, col: int):
    with pytest.raises(VerifyError, match="recursion") as e:
        parse(text)
    assert (e.value.line, e.value.col) == (line, col)


def test_recursion_built_in_python_is_refused():
    t = TensorType(DType.f32, ())
    call = lambda callee: Stmt(("y",), "call", ("x",), (("callee", callee),), (t,))  # noqa: E731
    f = Function("f", (Param("x", t),), (t,), (call("g"),), ("y",))
    g = Function("g", (Param("x", t),), (t,), (call("f"),), ("y",))
    with pytest.raises(VerifyError, match="recursion"):
        verify(Module(f, g))
