"""The CPU backend's results against the interpreter, op by op: random programs (core ops,
calls, entries cut into out-of-line parts, fused ops), every elementwise op and cast on the edge
values of every dtype, layout ops, reductions over every axis set (NaN and signed zeros), and
matmuls."""

from __future__ import annotations

from unittest import mock

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import eqsat
from eqsat.backend import compile_module, entry
from eqsat.ir import DType, parse
from eqsat.ir.ops import BINARY, COMPARE, CORE_OPS, OPS, UNARY
from eqsat.testing import default_ops, functions, inputs, modules

from cpu_helpers import assert_matches, compiled, run_both

SETTINGS = settings(max_examples=25, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
FUSED = sorted(set(default_ops()) - CORE_OPS)


# ---------------------------------------------------------------- hypothesis: random programs


@pytest.mark.parametrize("dtype", list(DType), ids=str)
@SETTINGS
@given(data=st.data())
def test_random_core_programs(dtype: DType, data) -> None:
    f = data.draw(functions(ops=CORE_OPS - {"call"}, dtypes=[dtype]))
    m = eqsat.Module(f)
    args = data.draw(inputs(f))
    got, want = run_both(m, f.name, *args)
    # Reductions and matmuls reassociate float sums: a relative tolerance on top of ulps.
    assert_matches(got, want, ulps=8, rtol=1e-5, atol=1e-5)


@SETTINGS
@given(data=st.data())
def test_random_modules_with_calls(data) -> None:
    m = data.draw(modules(ops=(CORE_OPS & default_ops(include_call=True)),
                          dtypes=[DType.f64, DType.i32, DType.bool]))
    f = m.functions[-1]
    got, want = run_both(m, f.name, *data.draw(inputs(f)))
    assert_matches(got, want, ulps=8, rtol=1e-9)


@SETTINGS
@given(data=st.data())
def test_random_modules_run_in_parts(data) -> None:
    """Entries cut into out-of-line parts of two statements each (long functions are), so
    values cross part boundaries, calls and returned parameters sit inside parts."""
    m = data.draw(modules(ops=(CORE_OPS & default_ops(include_call=True)),
                          dtypes=[DType.f32, DType.i64]))
    f = m.functions[-1]
    with mock.patch.object(entry, "PART_STATEMENTS", 2):
        got, want = run_both(m, f.name, *data.draw(inputs(f)))
    assert_matches(got, want, ulps=8, rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(not FUSED, reason="no fused ops with generators registered")
@SETTINGS
@given(data=st.data())
def test_random_fused_programs(data) -> None:
    f = data.draw(functions(ops=set(FUSED) | {"add", "mul", "exp", "sum", "broadcast"},
                            dtypes=[DType.f32, DType.f64, DType.i64]))
    m = eqsat.Module(f)
    got, want = run_both(m, f.name, *data.draw(inputs(f)))
    assert_matches(got, want, ulps=8, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------- every elementwise op, edge values

EDGE = {
    DType.f32: [0.0, -0.0, 1.0, -1.0, 0.5, -2.5, 3.0, 1e-40, -1e30, 88.0, 1e4, np.inf, -np.inf, np.nan],
    DType.f64: [0.0, -0.0, 1.0, -1.0, 0.5, -2.5, 3.0, 5e-320, -1e300, 700.0, 1e4, np.inf, -np.inf, np.nan],
    DType.i32: [0, 1, -1, 2, -2, 7, -7, 31, -31, 2**31 - 1, -2**31, 3, -3, 0],
    DType.i64: [0, 1, -1, 2, -2, 7, -7, 63, -63, 2**63 - 1, -2**63, 3, -3, 0],
    DType.bool: [True, False] * 7,
}


EXACT_SIGN = {"maximum", "minimum", "relu", "neg", "abs"}


def _accepts(op: str, *dtypes: DType) -> bool:
    try:
        OPS[op].infer([d[()] for d in dtypes], {}, None)
        return True
    except Exception:
        return False


@pytest.mark.parametrize("dtype", list(DType), ids=str)
def test_every_elementwise_op_on_edge_values(dtype: DType) -> None:
    """One module per dtype: a function per unary, binary and compare op it accepts, on every
    pair of edge values (NaN, infinities, zero divisors, INT_MIN, negative exponents)."""
    vals = np.array(EDGE[dtype], dtype=dtype.np)
    x = np.repeat(vals, len(vals))
    y = np.tile(vals, len(vals))
    n, t = x.size, f"{dtype}[{x.size}]"
    funcs = []
    for op in sorted(UNARY):
        if _accepts(op, dtype):
            funcs.append(f"func @{op}(%x: {t}, %y: {t}) -> {t} {{\n  %r = {op} %x : {t}\n  return %r\n}}")
    for op in sorted(BINARY | COMPARE):
        if _accepts(op, dtype, dtype):
            rt = f"bool[{n}]" if op in COMPARE else t
            funcs.append(f"func @{op}(%x: {t}, %y: {t}) -> {rt} {{\n  %r = {op} %x, %y : {rt}\n"
                         f"  return %r\n}}")
    m = parse("module @edge\n" + "\n".join(funcs))
    exe = compile_module(m, cache_dir=None)
    # The math library reduces trigonometric arguments accurately up to about 1e5 only; its
    # own tests cover its range, these cover the lowering.
    trig_x = np.where(np.isfinite(x) & (np.abs(x) > 1e5), 1e4, x).astype(x.dtype)
    for f in m.functions:
        xs = trig_x if f.name in ("sin", "cos") else x
        got, want = exe(f.name, xs, y), eqsat.interpret(m, f.name, xs, y)
        try:
            assert_matches(got, want, ulps=4)
            if f.name in EXACT_SIGN and dtype.is_float:  # numpy's sign for ties of -0 and +0
                np.testing.assert_array_equal(np.signbit(got), np.signbit(want))
        except AssertionError as e:
            raise AssertionError(f"@{f.name} on {dtype}: {e}") from None


@pytest.mark.parametrize("src", list(DType), ids=str)
def test_casts_between_all_dtypes(src: DType) -> None:
    vals = np.array(EDGE[src] + [2.0**40, -3.7, 300.5, 2.0**63] * (src.is_float), dtype=src.np)
    t = f"{src}[{vals.size}]"
    funcs = [f"func @to_{d}(%x: {t}) -> {d}[{vals.size}] {{\n  %r = cast %x : {d}[{vals.size}]\n"
             f"  return %r\n}}" for d in DType]
    m = parse("module @casts\n" + "\n".join(funcs))
    exe = compile_module(m, cache_dir=None)
    with np.errstate(all="ignore"):
        for f in m.functions:
            assert_matches(exe(f.name, vals), eqsat.interpret(m, f.name, vals), ulps=0)


def test_select_const_and_scalars() -> None:
    exe = compiled("""module @m
func @f(%c: bool[3], %x: i64[3], %y: i64[3]) -> (i64[3], f64[], bool[2,2]) {
  %s = select %c, %x, %y : i64[3]
  %k = const 2.5 : f64[]
  %b = const true : bool[2,2]
  return %s, %k, %b
}""")
    s, k, b = exe.f(np.array([True, False, True]), np.array([1, 2, 3]), np.array([4, 5, 6]))
    assert s.tolist() == [1, 5, 3] and k.shape == () and k == 2.5 and b.all()


# ---------------------------------------------------------------- layout, reductions, matmul


def test_layout_ops() -> None:
    m = parse("""module @m
func @f(%x: f32[2,3,4], %y: f32[2,5,4], %v: f32[4]) -> (f32[4,2,3], f32[2,2,4], f32[2,8,4], f32[24], f32[3,2,3,4]) {
  %t = transpose %x, perm=[2,0,1] : f32[4,2,3]
  %s = slice %x, start=[0,1,0], stop=[2,3,4] : f32[2,2,4]
  %c = concat %x, %y, axis=1 : f32[2,8,4]
  %r = reshape %x : f32[24]
  %b0 = broadcast %v : f32[3,1,1,4]
  %b1 = broadcast %b0 : f32[3,2,3,4]
  return %t, %s, %c, %r, %b1
}""")
    rng = np.random.default_rng(0)
    args = [rng.standard_normal(s).astype(np.float32) for s in ((2, 3, 4), (2, 5, 4), (4,))]
    got, want = run_both(m, "f", *args)
    assert_matches(got, want, ulps=0)


@pytest.mark.parametrize("dtype", [DType.f32, DType.f64, DType.i32, DType.i64, DType.bool], ids=str)
def test_reductions_over_every_axis_set(dtype: DType) -> None:
    shape = (3, 4, 5)
    lines, results = [], []
    for k, axes in enumerate([[0], [1], [2], [0, 1], [0, 2], [1, 2], [0, 1, 2], []]):
        kept = [d for i, d in enumerate(shape) if i not in axes]
        for op in ("sum", "max", "min"):
            if op == "sum" and dtype is DType.bool:
                continue
            rt = f"{dtype}[{','.join(map(str, kept))}]"
            lines.append(f"  %{op}{k} = {op} %x, axes={axes} : {rt}")
            results.append((f"%{op}{k}", rt))
    text = (f"module @m\nfunc @f(%x: {dtype}[3,4,5]) -> ({', '.join(t for _, t in results)}) {{\n"
            + "\n".join(lines) + f"\n  return {', '.join(n for n, _ in results)}\n}}")
    m = parse(text)
    rng = np.random.default_rng(1)
    x = (rng.standard_normal(shape) * 10).astype(dtype.np)
    if dtype.is_float:
        x[1, 2, 3] = np.nan  # max and min propagate it
    got, want = run_both(m, "f", x)
    assert_matches(got, want, ulps=8, rtol=1e-6)


@pytest.mark.parametrize("dtype", [DType.f32, DType.f64], ids=str)
def test_sums_of_negative_zeros_are_positive_zero(dtype: DType) -> None:
    """numpy's sum starts from +0.0, so a sum of -0.0s is +0.0 whatever the count; under the
    nsz flag LLVM folded 0.0 + x to x where one element reaches each output (a length-1 axis,
    no axes, a scalar), giving -0.0 there."""
    cases = [((1,), [0]), ((1, 1), [0, 1]), ((3, 1), [1]), ((2,), []), ((), []), ((4, 5), [1]),
             ((5000,), [0])]
    lines, results, args = [], [], []
    for k, (shape, axes) in enumerate(cases):
        kept = ",".join(str(d) for i, d in enumerate(shape) if i not in axes)
        lines.append(f"  %s{k} = sum %x{k}, axes={axes} : {dtype}[{kept}]")
        results.append((f"%s{k}", f"{dtype}[{kept}]"))
        args.append(np.full(shape, -0.0, dtype.np))
    params = ", ".join(f"%x{k}: {dtype}[{','.join(map(str, s))}]" for k, (s, _) in enumerate(cases))
    text = (f"func @f({params}) -> ({', '.join(t for _, t in results)}) {{\n" + "\n".join(lines)
            + f"\n  return {', '.join(n for n, _ in results)}\n}}")
    got, want = run_both(parse(text), "f", *args)
    for g, w in zip(got, want):
        assert not np.signbit(w).any()
        np.testing.assert_array_equal(np.signbit(g), np.signbit(w))


@pytest.mark.parametrize("dtype", [DType.f32, DType.f64], ids=str)
def test_vectorized_max_and_min_propagate_nan_from_any_lane(dtype: DType) -> None:
    """Rows long enough for the vector accumulators: a NaN in any lane or any step of the
    loop (or in the tail) makes the row's max and min NaN, as numpy's; infinities count."""
    n = 203
    text = (f"module @m\nfunc @f(%x: {dtype}[{n},{n}]) -> ({dtype}[{n}], {dtype}[{n}]) {{\n"
            f"  %a = max %x, axes=[1] : {dtype}[{n}]\n  %b = min %x, axes=[1] : {dtype}[{n}]\n"
            "  return %a, %b\n}")
    x = np.random.default_rng(3).standard_normal((n, n)).astype(dtype.np)
    for row in range(0, n, 3):
        x[row, (row * 7) % n] = np.nan
    x[1, 5], x[2, 200], x[4, 0] = np.inf, -np.inf, np.inf
    x[5, :] = -0.0
    got, want = run_both(parse(text), "f", x)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("dtype", [DType.f32, DType.f64, DType.i32, DType.i64], ids=str)
@pytest.mark.parametrize("shapes", [((5, 3), (3, 7)), ((2, 3, 4), (2, 4, 1)),
                                    ((96, 64), (64, 80)), ((2, 72, 64), (2, 64, 72)),
                                    ((4, 0), (0, 3))], ids=str)
def test_matmul(dtype: DType, shapes) -> None:
    """Small products are loops, large float ones BLAS; batch dims and k = 0 included."""
    (sa, sb) = shapes
    out = sa[:-1] + sb[-1:]
    fmt = lambda s: f"{dtype}[{','.join(map(str, s))}]"  # noqa: E731
    m = parse(f"module @m\nfunc @f(%a: {fmt(sa)}, %b: {fmt(sb)}) -> {fmt(out)} {{\n"
              f"  %c = matmul %a, %b : {fmt(out)}\n  return %c\n}}")
    rng = np.random.default_rng(2)
    a, b = ((rng.standard_normal(s) * 4).astype(dtype.np) for s in (sa, sb))
    got, want = run_both(m, "f", a, b)
    # Products summed in another order than the interpreter's BLAS (the generated GEMM):
    # an absolute slack of k roundings of terms ~16 in size, for elements that cancel.
    slack = 64 * sa[-1] * float(np.finfo(dtype.np).eps) if dtype.is_float else 0.0
    assert_matches(got, want, ulps=16, rtol=1e-5, atol=slack)


@pytest.mark.skipif("matmul_t" not in OPS, reason="fused ops not registered")
@pytest.mark.parametrize("size", [4, 80], ids=["loops", "blas"])
@pytest.mark.parametrize("ta,tb", [(0, 0), (0, 1), (1, 0), (1, 1)])
def test_matmul_t_and_epilogue(size: int, ta: int, tb: int) -> None:
    m_, k, n = size, size + 3, size + 5
    sa = (k, m_) if ta else (m_, k)
    sb = (n, k) if tb else (k, n)
    f = lambda s: f"f64[{','.join(map(str, s))}]"  # noqa: E731
    m = parse(f"""module @m
func @f(%a: {f(sa)}, %b: {f(sb)}, %bias: f64[{n}]) -> ({f((m_, n))}, {f((m_, n))}) {{
  %c = matmul_t %a, %b, ta={ta}, tb={tb} : {f((m_, n))}
  %e = matmul_epi %a, %b, %bias, ta={ta}, tb={tb}, body=relu(add($0, $1)) : {f((m_, n))}
  return %c, %e
}}""")
    rng = np.random.default_rng(3)
    args = [rng.standard_normal(s) for s in (sa, sb, (n,))]
    got, want = run_both(m, "f", *args)
    assert_matches(got, want, ulps=16, rtol=1e-12)
