"""Fused-kernel and layout ops' numpy semantics: hand-written programs, every body op, merged
bodies and drawn programs against their unfused core-op form (bitwise) and against numpy."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import eqsat
from eqsat.ir.fused import unfuse, unfuse_function, unfuse_module
from eqsat.ir.ops import CORE_OPS, OPS, OpTypeError, ops_in
from eqsat.ir.scalar_expr import (App, Arg, Lit, body_args, body_op_names, body_ops, check_body,
                                  elementwise_body, eval_body, format_body, merge, operand_roles,
                                  parse_body, substitute)
from eqsat.ir.types import DType

from fused_helpers import GOLDEN

FLOATS = (np.float32, np.float64)


def rand(rng: np.random.Generator, shape: tuple[int, ...], dtype) -> np.ndarray:
    return rng.standard_normal(shape).astype(dtype)


def assert_same(a, b) -> None:
    """Bitwise-equal results (NaN equals NaN), as fused and unfused programs must give."""
    for x, y in zip(a if isinstance(a, tuple) else (a,), b if isinstance(b, tuple) else (b,)):
        assert x.dtype == y.dtype and x.shape == y.shape
        np.testing.assert_array_equal(x, y)


# ---------------------------------------------------------------- semantics: hand-written


def test_golden_program_matches_numpy_and_its_unfused_form():
    m = eqsat.parse(GOLDEN)
    u = unfuse_module(m)
    eqsat.verify(u)
    assert all(s.op in CORE_OPS for f in u.functions for s in f.body)
    rng = np.random.default_rng(0)
    x, w, b = rand(rng, (4, 8), "f4"), rand(rng, (8,), "f4"), rand(rng, (4, 1), "f4")
    got = eqsat.interpret(m, "f", x, w, b)
    assert_same(got, eqsat.interpret(u, "f", x, w, b))
    y, s, g, c = got
    np.testing.assert_allclose(y, np.tanh(x * w + b), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(s, ((x - w) ** 2).sum(axis=1), rtol=1e-5)
    np.testing.assert_array_equal(g, np.where(x > 0, x, x * np.float32(0.01)))
    np.testing.assert_array_equal(c, np.maximum(x, -np.inf) != w)

    i, j = rng.integers(-20, 20, 5).astype("i4"), rng.integers(-9, 9, (2, 5))
    k, mx, n = eqsat.interpret(m, "ints", i, j)
    assert_same((k, mx, n), eqsat.interpret(u, "ints", i, j))
    np.testing.assert_array_equal(k, (i - 7) // 2)
    np.testing.assert_array_equal(mx, np.abs(j).max(axis=1))
    np.testing.assert_array_equal(n, np.full((2, 5), 3))

    a, bb, bias = rand(rng, (8, 4), "f8"), rand(rng, (6, 8), "f8"), rand(rng, (6,), "f8")
    cc, h = eqsat.interpret(m, "mm", a, bb, bias)
    assert_same((cc, h), eqsat.interpret(u, "mm", a, bb, bias))
    np.testing.assert_allclose(cc, a.T @ bb.T, rtol=1e-12)
    np.testing.assert_allclose(h, np.maximum(a.T @ bb.T + bias, 0), rtol=1e-12)


@pytest.mark.parametrize("op", sorted(body_op_names()))
@pytest.mark.parametrize("dtype", FLOATS)
def test_every_body_op_equals_its_core_op(op, dtype):
    conds, _ = operand_roles(op)
    dt = DType.of(dtype)
    ins = [eqsat.bool_ if c else dt for c in conds]
    t = OPS[op].infer([d[2, 3] for d in ins], {}, None)
    params = ", ".join(f"%p{i}: {d}[2,3]" for i, d in enumerate(ins))
    operands = ", ".join(f"%p{i}" for i in range(len(ins)))
    fused = (f"func @f({params}) -> {t} {{\n  %r = map {operands}, "
             f"body={format_body(elementwise_body(op))} : {t}\n  return %r\n}}\n")
    core = f"func @f({params}) -> {t} {{\n  %r = {op} {operands} : {t}\n  return %r\n}}\n"
    mf, mc = eqsat.parse(fused), eqsat.parse(core)
    assert unfuse_module(mf) == mc
    rng = np.random.default_rng(1)
    args = [rng.random((2, 3)) < 0.5 if c else rand(rng, (2, 3), dtype) for c in conds]
    assert_same(eqsat.interpret(mf, "f", *args), eqsat.interpret(mc, "f", *args))


def test_merging_a_producer_into_its_consumer():
    producer = parse_body("mul($0, exp($1))")
    consumer = parse_body("sub($2, tanh($1))")
    merged = merge(consumer, 1, producer, 3)
    assert format_body(merged) == "sub($1, tanh(mul($2, exp($3))))"
    text = """\
func @two(%z: f32[3,4], %w: f32[4], %x: f32[3,4], %y: f32[3,1]) -> f32[3,4] {
  %p = map %x, %y, body=mul($0, exp($1)) : f32[3,4]
  %c = map %z, %p, %w, body=sub($2, tanh($1)) : f32[3,4]
  return %c
}

func @one(%z: f32[3,4], %w: f32[4], %x: f32[3,4], %y: f32[3,1]) -> f32[3,4] {
  %c = map %z, %w, %x, %y, body=BODY : f32[3,4]
  return %c
}
""".replace("BODY", format_body(merged))
    m = eqsat.parse(text)
    rng = np.random.default_rng(2)
    args = (rand(rng, (3, 4), "f4"), rand(rng, (4,), "f4"), rand(rng, (3, 4), "f4"),
            rand(rng, (3, 1), "f4"))
    assert_same(eqsat.interpret(m, "two", *args), eqsat.interpret(m, "one", *args))


def test_body_helpers():
    b = parse_body("tanh(add(mul($0, $2), 0.5))")
    assert body_ops(b) == {"tanh", "add", "mul"}
    assert body_args(b) == {0, 2}
    assert format_body(substitute(b, {2: parse_body("neg($1)")})) == \
        "tanh(add(mul($0, neg($1)), 0.5))"
    assert elementwise_body("select") == parse_body("select($0, $1, $2)")
    assert check_body(parse_body("gt($0, 1)"), [DType.i32]) is DType.bool
    with pytest.raises(OpTypeError, match="out of range"):
        check_body(b, [DType.f32, DType.f32])
    x = np.linspace(-2, 2, 12, dtype=np.float32).reshape(3, 4)
    bias = np.arange(4, dtype=np.float32)
    got = eval_body(parse_body("select(gt($0, 0.0), $0, mul($0, 0.01))"), [x])
    np.testing.assert_array_equal(got, np.where(x > 0, x, x * np.float32(0.01)))
    got = eval_body(parse_body("add($0, $1)"), [x, bias])
    assert got.dtype == np.float32 and got.shape == (3, 4)
    np.testing.assert_array_equal(got, x + bias)


def test_unfuse_names_avoid_existing_ones():
    text = """\
func @f(%y.0: f32[2,3], %b: f32[3]) -> f32[2,3] {
  %y = map %y.0, %b, body=add($0, $1) : f32[2,3]
  %y.1 = neg %y : f32[2,3]
  return %y.1
}
"""
    m = eqsat.parse(text)
    f = unfuse_function(m["f"])
    names = [r for s in f.body for r in s.results]
    assert len(names) == len(set(names)) and "y.0" not in names
    eqsat.verify(m.replace([f]))
    s = m["f"].body[1]
    assert unfuse(s, m["f"].types()) == [s]


def test_identity_body_unfuses_to_a_copy():
    m = eqsat.parse("func @f(%x: f64[3]) -> f64[3] {\n  %y = map %x, body=$0 : f64[3]\n"
                    "  return %y\n}\n")
    (s,) = unfuse_function(m["f"]).body
    assert (s.op, s.operands) == ("broadcast", ("x",))
    x = np.arange(3.0)
    y = eqsat.interpret(m, "f", x)
    assert not np.shares_memory(x, y)


# ---------------------------------------------------------------- semantics: generated

ROLES = {op: operand_roles(op) for op in sorted(body_op_names())}
NUMERIC = [op for op, (conds, same) in ROLES.items() if same and not any(conds)]
CHOICE = [op for op, (conds, same) in ROLES.items() if any(conds)]
PREDICATES = [op for op, (conds, same) in ROLES.items() if not same and not any(conds)]
SHAPE = (3, 4)
OPERAND_SHAPES = [(3, 4), (4,), (1, 4), (3, 1), (), (1, 1)]


@st.composite
def bodies(draw, n_inputs: int, boolean: bool = False, budget: int = 4):
    """Bodies computing a float (or a bool) from float inputs, built from the table's ops."""
    if boolean:
        op = draw(st.sampled_from(PREDICATES))
        return App(op, tuple(draw(bodies(n_inputs, False, budget - 1)) for _ in range(2)))
    if budget <= 0 or draw(st.integers(0, 3)) == 0:
        if draw(st.integers(0, 3)) == 0:
            return Lit(draw(st.floats(-3, 3, width=32)))
        return Arg(draw(st.integers(0, n_inputs - 1)))
    op = draw(st.sampled_from(NUMERIC + CHOICE))
    conds, _ = ROLES[op]
    return App(op, tuple(draw(bodies(n_inputs, c, budget - 1)) for c in conds))


@st.composite
def fused_programs(draw):
    dtype = draw(st.sampled_from(["f32", "f64"]))
    n = draw(st.integers(1, 3))
    shapes = [draw(st.sampled_from(OPERAND_SHAPES)) for _ in range(n)]
    body_map = draw(bodies(n))
    body_red = draw(bodies(n))
    try:
        for body, expected in ((body_map, DType(dtype)), (body_red, None)):
            check_body(body, [DType(dtype)] * n, expected)
    except OpTypeError:
        assume(False)
    domain = tuple(np.broadcast_shapes(*shapes))
    axes = draw(st.lists(st.integers(0, len(domain) - 1), unique=True)) if domain else []
    reduce = draw(st.sampled_from(sorted(ops_in("reduce"))))
    kept = [d for i, d in enumerate(domain) if i not in axes]
    params = ", ".join(f"%a{i}: {dtype}[{','.join(map(str, s))}]" for i, s in enumerate(shapes))
    operands = ", ".join(f"%a{i}" for i in range(n))
    red_t = f"{dtype}[{','.join(map(str, kept))}]"
    text = (f"func @f({params}) -> ({dtype}[3,4], {red_t}) {{\n"
            f"  %m = map {operands}, body={format_body(body_map)} : {dtype}[3,4]\n"
            f"  %r = map_reduce {operands}, body={format_body(body_red)}, reduce={reduce}, "
            f"axes=[{','.join(map(str, axes))}] : {red_t}\n"
            f"  return %m, %r\n}}\n")
    return text, dtype, shapes


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(fused_programs(), st.integers(0, 2**32 - 1))
def test_generated_maps_equal_their_unfused_programs(program, seed):
    text, dtype, shapes = program
    m = eqsat.parse(text)
    assert str(m) == "module @main\n\n" + text
    u = unfuse_module(m)
    eqsat.verify(u)
    assert all(s.op in CORE_OPS for s in u["f"].body)
    rng = np.random.default_rng(seed)
    args = [rand(rng, s, DType(dtype).np) for s in shapes]
    assert_same(eqsat.interpret(m, "f", *args), eqsat.interpret(u, "f", *args))


MATMUL_CASES = [
    # a, b, ta, tb, extra operand shapes
    ((3, 5), (5, 2), 0, 0, [(2,)]),
    ((5, 3), (5, 2), 1, 0, [(3, 1)]),
    ((3, 5), (2, 5), 0, 1, [(), (3, 2)]),
    ((2, 5, 3), (2, 4, 5), 1, 1, [(2, 1, 4), (4,)]),
]


@pytest.mark.parametrize("a_shape, b_shape, ta, tb, extras", MATMUL_CASES)
@pytest.mark.parametrize("dtype", FLOATS)
def test_matmuls_match_numpy_and_unfused(a_shape, b_shape, ta, tb, extras, dtype):
    dt = DType.of(dtype)
    rng = np.random.default_rng(3)
    a, b = rand(rng, a_shape, dtype), rand(rng, b_shape, dtype)
    es = [rand(rng, s, dtype) for s in extras]
    opa = np.swapaxes(a, -1, -2) if ta else a
    opb = np.swapaxes(b, -1, -2) if tb else b
    want = opa @ opb
    t = dt[want.shape]
    ext_params = "".join(f", %e{i}: {dt[s]}" for i, s in enumerate(extras))
    ext_ops = "".join(f", %e{i}" for i in range(len(extras)))
    body = "sigmoid(sub($0, mul($1, 0.5)))" if len(extras) == 1 else \
        "select(gt($1, 0.0), relu(add($0, $2)), $0)"
    text = (f"func @f(%a: {dt[a_shape]}, %b: {dt[b_shape]}{ext_params}) -> ({t}, {t}) {{\n"
            f"  %p = matmul_t %a, %b, ta={ta}, tb={tb} : {t}\n"
            f"  %q = matmul_epi %a, %b{ext_ops}, ta={ta}, tb={tb}, body={body} : {t}\n"
            f"  return %p, %q\n}}\n")
    m = eqsat.parse(text)
    assert str(m) == "module @main\n\n" + text
    p, q = eqsat.interpret(m, "f", a, b, *es)
    assert_same((p, q), eqsat.interpret(unfuse_module(m), "f", a, b, *es))
    tol = 1e-5 if dtype is np.float32 else 1e-12
    np.testing.assert_allclose(p, want, rtol=tol, atol=tol)
    if len(es) == 1:
        hand = 1 / (1 + np.exp(-(want - es[0] * dtype(0.5))))
    else:
        hand = np.where(es[0] > 0, np.maximum(want + es[1], 0), want)
    np.testing.assert_allclose(q, hand, rtol=tol, atol=tol)
    assert math.isfinite(float(np.abs(q).sum()))


@pytest.mark.parametrize("body,rtype,extra", [
    ("gt($0, 0.0)", "bool", ""),
    ("select(lt($0, 0.0), $1, $1)", "i32", ", %e"),
])
def test_matmul_epi_whose_body_changes_the_dtype_compiles(body, rtype, extra):
    """A matmul_epi with a bool (or other-dtype) body verifies and interprets; the CPU backend
    crashed in llvmlite ("Operands must be the same type") finishing the product in place."""
    m = eqsat.parse(f"""func @f(%a: f32[5,3], %b: f32[3,4], %e: i32[4]) -> {rtype}[5,4] {{
  %d = matmul_epi %a, %b{extra}, ta=0, tb=0, body={body} : {rtype}[5,4]
  return %d
}}""")
    rng = np.random.default_rng(0)
    args = [rng.standard_normal((5, 3)).astype(np.float32),
            rng.standard_normal((3, 4)).astype(np.float32), np.arange(4, dtype=np.int32)]
    want = eqsat.interpret(m, "f", *args)
    np.testing.assert_array_equal(eqsat.compile(m, optimize=False)("f", *args), want)
    np.testing.assert_array_equal(eqsat.compile(m)("f", *args), want)
