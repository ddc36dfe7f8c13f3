"""The CPU backend against the interpreter: every op, every dtype, calls, fused ops, input
checking, the LLVM IR it emits, threads, and the caches."""

from __future__ import annotations

import copy
import os
import pickle
import signal
import threading
import time
from unittest import mock

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import eqsat
from eqsat.backend import LoweringError, compile_module, cpu, emit_llvm, entry
from eqsat.backend.entry import plan_module
from eqsat.backend.llvm_kernels import KernelBuilder, build_kernel
from eqsat.ir import DType, Stmt, parse
from eqsat.ir.ops import BINARY, COMPARE, CORE_OPS, OPS, UNARY
from eqsat.testing import default_ops, functions, inputs, modules

SETTINGS = settings(max_examples=25, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
FUSED = sorted(set(default_ops()) - CORE_OPS)


def compiled(text: str):
    """Compile module text without touching the disk cache."""
    return compile_module(parse(text), cache_dir=None)


def assert_matches(got, want, ulps: int = 4, rtol: float = 0.0, atol: float = 0.0) -> None:
    """Integers and bools exactly; floats within `ulps` units in the last place (plus `rtol`
    and `atol`, for sums in another order), NaN where the interpreter has NaN."""
    got = got if isinstance(got, tuple) else (got,)
    want = want if isinstance(want, tuple) else (want,)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        if w.dtype.kind != "f":
            np.testing.assert_array_equal(g, w)
            continue
        np.testing.assert_array_equal(np.isnan(g), np.isnan(w))
        finite = np.isfinite(w)
        np.testing.assert_array_equal(g[~finite & ~np.isnan(w)], w[~finite & ~np.isnan(w)])
        tiny = np.finfo(w.dtype).tiny
        err = np.abs(g[finite].astype(np.float64) - w[finite])
        tol = ulps * np.spacing(np.abs(w[finite])) + rtol * np.abs(w[finite]) + ulps * tiny + atol
        assert np.all(err <= tol), f"max error {err.max()} > tolerance"


def run_both(module, name: str, *args):
    exe = compile_module(module, cache_dir=None)
    return exe(name, *args), eqsat.interpret(module, name, *args)


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


# ---------------------------------------------------------------- calls, results, inputs


def test_calls_multiple_results_and_returned_params() -> None:
    m = parse("""module @m
func @g(%x: f64[4], %y: f64[4]) -> (f64[4], f64[4]) {
  %s = add %x, %y : f64[4]
  %d = sub %x, %y : f64[4]
  return %s, %d
}
func @f(%x: f64[4], %y: f64[4]) -> (f64[4], f64[4], f64[4], f64[2,2], f64[4]) {
  %a, %b = call @g(%x, %y) : f64[4], f64[4]
  %c, %d = call @g(%a, %b) : f64[4], f64[4]
  %r = reshape %c : f64[2,2]
  return %c, %x, %c, %r, %d
}""")
    x, y = np.arange(4.0), np.array([1.0, -2.0, 0.5, 3.0])
    exe = compile_module(m, cache_dir=None)
    got = exe.f(x, y)
    assert_matches(got, eqsat.interpret(m, "f", x, y), ulps=0)
    assert got[1] is not x and not np.shares_memory(got[0], got[2])
    assert_matches(exe("g", x, y), eqsat.interpret(m, "g", x, y), ulps=0)


def test_input_checking_and_fresh_outputs() -> None:
    exe = compiled("module @m\nfunc @f(%x: f32[2,3]) -> f32[3,2] {\n"
                   "  %t = transpose %x, perm=[1,0] : f32[3,2]\n  return %t\n}")
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    with pytest.raises(eqsat.Error, match="shape"):
        exe.f(np.zeros((3, 2), np.float32))
    with pytest.raises(eqsat.Error, match="float64"):
        exe.f(x.astype(np.float64))
    with pytest.raises(eqsat.Error, match="argument"):
        exe.f(x, x)
    with pytest.raises(eqsat.Error, match="no function @g"):
        exe("g", x)
    with pytest.raises(eqsat.UnknownFunction, match="no function @g; it has @f"):
        exe.g  # an eqsat.Error and an AttributeError, so hasattr works:
    assert not hasattr(exe, "g") and getattr(exe, "g", None) is None and hasattr(exe, "f")
    wide = np.arange(12, dtype=np.float32).reshape(2, 6)[:, ::2]  # not contiguous
    np.testing.assert_array_equal(exe.f(wide), wide.T)
    r1, r2 = exe.f(x), exe.f(x)
    assert r1 is not r2 and not np.shares_memory(r1, r2)
    # below runtime.STREAM_MIN a result is a plain array of its own (resize works); only a
    # result kernels may stream into is a view at a cache-line boundary
    assert r1.flags.owndata
    r1.resize(6)


def test_executables_pickle_and_copy() -> None:
    """An executable goes to a worker process (multiprocessing pickles it) or through
    copy.deepcopy as its module, compiled again there; ctypes pointers refused pickling."""
    exe = eqsat.compile(eqsat.parse("func @f(%x: f32[3]) -> f32[3] {\n  %y = exp %x : f32[3]\n"
                                    "  return %y\n}"), optimize=False)
    x = np.array([0.5, -1.0, 2.0], np.float32)
    for copied in (pickle.loads(pickle.dumps(exe)), copy.deepcopy(exe), copy.copy(exe)):
        assert copied.module == exe.module and copied.key == exe.key
        np.testing.assert_array_equal(copied.f(x), exe.f(x))
    # `pool.map(exe.f, batches)` pickles the function: it was a lambda (AttributeError)
    np.testing.assert_array_equal(pickle.loads(pickle.dumps(exe.f))(x), exe.f(x))


def test_gradient_declarations_are_refused() -> None:
    m = parse("module @m\nfunc @f(%x: f32[]) -> f32[] {\n  %y = mul %x, %x : f32[]\n"
              "  return %y\n}\nfunc @g = grad @f wrt %x")
    with pytest.raises(eqsat.Error, match="differentiate"):
        compile_module(m, cache_dir=None)


def test_dispatcher_names_the_op_it_cannot_lower() -> None:
    from llvmlite import ir

    s = Stmt(("r",), "call", ("x",), (("callee", "g"),), (DType.f32[2],))
    with pytest.raises(LoweringError, match="'call'"):
        build_kernel(KernelBuilder(ir.Module()), s, [DType.f32[2]])


# ---------------------------------------------------------------- generated code


CHAIN = """module @m
func @f(%x: f32[4096], %w: f32[4096], %b: f32[4096]) -> f32[4096] {
  %0 = mul %x, %w : f32[4096]
  %1 = add %0, %b : f32[4096]
  %2 = tanh %1 : f32[4096]
  %3 = sigmoid %x : f32[4096]
  %4 = mul %2, %3 : f32[4096]
  %5 = sum %4, axes=[0] : f32[]
  %6 = broadcast %5 : f32[4096]
  %7 = div %4, %6 : f32[4096]
  return %7
}"""


def test_llvm_ir_is_vectorized() -> None:
    text = emit_llvm(parse(CHAIN))
    assert "define void @\"eqsat.fn.f\"" in text or "define void @eqsat.fn.f" in text
    assert "<16 x float>" in text or "<8 x float>" in text
    assert "fadd reassoc" in text  # the sum's vector accumulator
    assert "@tanhf" not in text and "@llvm.tanh" not in text  # no scalar libm in the loop


def test_arena_reuses_dead_buffers() -> None:
    # Larger than entry.KEEP_SMALL: small buffers are deliberately never reused.
    lines = [f"  %{i + 1} = exp %{i if i else 'x'} : f64[40000]" for i in range(10)]
    text = ("module @m\nfunc @f(%x: f64[40000]) -> f64[40000] {\n" + "\n".join(lines)
            + "\n  return %10\n}")
    m = parse(text)
    plan = plan_module(m)["f"]
    assert plan.arena_bytes <= 2 * 320064  # ten intermediates, two buffers in turn
    got, want = run_both(m, "f", np.linspace(-1, 1, 40000))
    assert_matches(got, want, ulps=8)


def test_threads_split_large_kernels_without_wrong_answers() -> None:
    m = parse("""module @m
func @f(%x: f32[1024,2048], %y: f32[1024,2048], %a: i32[512,64], %b: i32[64,64]) -> (f32[1024,2048], f32[1024], f32[2048,1024], i32[512,64]) {
  %m = mul %x, %y : f32[1024,2048]
  %s = sum %m, axes=[1] : f32[1024]
  %t = transpose %m, perm=[1,0] : f32[2048,1024]
  %p = matmul %a, %b : i32[512,64]
  return %m, %s, %t, %p
}""")
    assert "eqsat_parallel" in emit_llvm(m)  # the thread pool (parallel.py)
    rng = np.random.default_rng(4)
    args = [rng.standard_normal((1024, 2048)).astype(np.float32) for _ in range(2)]
    args += [rng.integers(-100, 100, s).astype(np.int32) for s in ((512, 64), (64, 64))]
    exe = compile_module(m, cache_dir=None)
    want = eqsat.interpret(m, "f", *args)
    results: list = [None] * 3

    def work(i: int) -> None:
        results[i] = exe.f(*args)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for got in results:
        # The row sums of 2048 products cancel: an absolute tolerance scaled to their terms.
        assert_matches(got, want, ulps=8, rtol=1e-5, atol=1e-2)


# ---------------------------------------------------------------- caches


def test_disk_cache_hit_is_faster(tmp_path) -> None:
    m = parse(CHAIN.replace("4096", "4097"))
    cpu._memory.pop(cpu.cache_key(m), None)
    t0 = time.perf_counter()
    exe1 = compile_module(m, cache_dir=tmp_path)
    cold = time.perf_counter() - t0
    assert list(tmp_path.glob("*.o"))
    cpu._memory.pop(cpu.cache_key(m), None)
    t0 = time.perf_counter()
    exe2 = compile_module(m, cache_dir=tmp_path)
    warm = time.perf_counter() - t0
    assert warm < cold
    x = np.linspace(-2, 2, 4097, dtype=np.float32)
    np.testing.assert_array_equal(exe1.f(x, x, x), exe2.f(x, x, x))
    t0 = time.perf_counter()
    compile_module(m, cache_dir=tmp_path)  # the memory cache
    assert time.perf_counter() - t0 < warm + 0.01


@pytest.mark.parametrize("lock", ["compile", "llvmlite"])
def test_a_child_forked_while_another_thread_compiles_can_compile(lock: str) -> None:
    """A child forked while another thread held the compile lock (or llvmlite's, freeing an
    engine) inherited it held by no thread: its first eqsat.compile hung for good (a
    multiprocessing pool started beside a compiling thread). Fork now waits for both."""
    import llvmlite.binding as llvm

    held_lock = cpu._lock if lock == "compile" else llvm.ffi.lib._lock
    m = parse(f"module @forked_{lock}\nfunc @f(%x: f32[4]) -> f32[4] {{\n"
              "  %y = sqrt %x : f32[4]\n  return %y\n}")
    held = threading.Event()

    def compiling() -> None:
        with held_lock:
            held.set()
            time.sleep(0.3)

    t = threading.Thread(target=compiling)
    t.start()
    held.wait()
    pid = os.fork()
    if pid == 0:  # pragma: no cover (the child)
        signal.alarm(20)
        x = np.array([0.0, 1.0, 4.0, 9.0], np.float32)
        ok = np.array_equal(compile_module(m, cache_dir=None).f(x), np.sqrt(x))
        os._exit(0 if ok else 3)
    t.join()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_dir_lists_the_functions():
    exe = eqsat.compile(eqsat.parse("func @first(%x: f32[2]) -> f32[2] {\n  %y = neg %x : f32[2]\n"
                                    "  return %y\n}"), optimize=False)
    assert "first" in dir(exe) and "functions" in dir(exe)
