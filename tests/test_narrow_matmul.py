"""Narrow and small float products (eqsat/backend/narrow_matmul.py): hypothesis-drawn shapes,
transposed operands, batches and epilogues through the public compile path, against numpy
in float64 and the interpreter, with the path each takes checked."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import eqsat
from eqsat.backend import compile_module, jit, matmul_kernels, narrow_matmul, parallel
from eqsat.ir import DType, parse

from backend_paths import count_paths

SETTINGS = settings(max_examples=25, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
DTYPES = {"f32": np.float32, "f64": np.float64}
INTS = {"i32": np.int32, "i64": np.int64}
EPS = {"f32": 2.0 ** -24, "f64": 2.0 ** -53}


def ty(dtype: str, shape) -> str:
    return f"{dtype}[{','.join(map(str, shape))}]"


def check(got: np.ndarray, want: np.ndarray, k: int, dtype: str, mags: float = 1.0) -> None:
    """Within a rounding bound of a k-term sum of products of magnitude `mags`."""
    assert got.shape == want.shape and got.dtype == np.dtype(DTYPES[dtype])
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=0,
                               atol=4 * (k + 2) * EPS[dtype] * mags)


def product_module(dtype: str, batch: tuple[int, ...], m: int, n: int, k: int, ta: bool,
                   tb: bool) -> eqsat.Module:
    """@f returns op(A) @ op(B) alone and with a bias + relu + residual epilogue."""
    sa = (*batch, k, m) if ta else (*batch, m, k)
    sb = (*batch, n, k) if tb else (*batch, k, n)
    t = ty(dtype, (*batch, m, n))
    flags = f"ta={int(ta)}, tb={int(tb)}"
    return parse(f"""module @m
func @f(%a: {ty(dtype, sa)}, %b: {ty(dtype, sb)}, %bias: {dtype}[{n}], %res: {t}) -> ({t}, {t}) {{
  %c = matmul_t %a, %b, {flags} : {t}
  %e = matmul_epi %a, %b, %bias, %res, {flags}, body=add(relu(add($0, $1)), $2) : {t}
  return %c, %e
}}""")


def run_and_check(dtype: str, batch: tuple[int, ...], m: int, n: int, k: int, ta: bool,
                  tb: bool, seed: int) -> None:
    mod = product_module(dtype, batch, m, n, k, ta, tb)
    f = mod["f"]
    rng = np.random.default_rng(seed)
    if dtype in INTS:  # exact, wrapping (the epilogue's relu and bias too)
        args = [rng.integers(-2**31, 2**31, p.type.shape, dtype=INTS[dtype]) for p in f.params]
        got = compile_module(mod, cache_dir=None)("f", *args)
        for g, w in zip(got, eqsat.interpret(mod, "f", *args)):
            np.testing.assert_array_equal(g, w)
        a, b = args[:2]
        with np.errstate(over="ignore"):
            want = (np.swapaxes(a, -1, -2) if ta else a) @ (np.swapaxes(b, -1, -2) if tb else b)
        np.testing.assert_array_equal(got[0], want)
        return
    a, b, bias, res = (rng.uniform(-1, 1, p.type.shape).astype(DTYPES[dtype]) for p in f.params)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    prod = (np.swapaxes(a64, -1, -2) if ta else a64) @ (np.swapaxes(b64, -1, -2) if tb else b64)
    c, e = compile_module(mod, cache_dir=None)("f", a, b, bias, res)
    check(c, prod, k, dtype)
    check(e, np.maximum(prod + bias, 0) + res, k, dtype, mags=2.0)
    ic, ie = eqsat.interpret(mod, "f", a, b, bias, res)
    check(c, ic.astype(np.float64), k, dtype)
    check(e, ie.astype(np.float64), k, dtype, mags=2.0)


def paths(mod: eqsat.Module) -> dict[str, int]:
    with count_paths() as hits:
        compile_module(mod, cache_dir=None)
    return dict(hits)


@pytest.mark.parametrize("dtype", ["f32", "f64"])
@SETTINGS
@given(data=st.data(), ta=st.booleans(), tb=st.booleans())
def test_narrow_products(dtype: str, data, ta: bool, tb: bool) -> None:
    """At most a vector of columns, any rows (ragged row blocks and vectors), any depth, batched
    or not: every remainder of the blocks and masks, read as stored or transposed."""
    w = narrow_matmul.lanes(DType(dtype))
    n = data.draw(st.integers(1, w), label="n")
    m = data.draw(st.integers(1, 300), label="m")
    k = data.draw(st.integers(1, 400), label="k")
    batch = data.draw(st.sampled_from([(), (3,)]), label="batch")
    run_and_check(dtype, batch, m, n, k, ta, tb, seed=m + 7 * n + 13 * k)


@pytest.mark.parametrize("dtype", ["f32", "f64", "i32", "i64"])
@SETTINGS
@given(data=st.data(), ta=st.booleans())
def test_small_products(dtype: str, data, ta: bool) -> None:
    """Below the BLAS's size (integers: any size), any width: column blocks of up to
    COLUMN_VECTORS vectors, the last one masked."""
    m = data.draw(st.integers(1, 40), label="m")
    n = data.draw(st.integers(1, 150), label="n")
    k_max = max(1, (matmul_kernels.BLAS_MIN_FLOPS - 1) // (m * n))
    k = data.draw(st.integers(1, min(k_max, 200)), label="k")
    batch = data.draw(st.sampled_from([(), (2,)]), label="batch")
    run_and_check(dtype, batch, m, n, k, ta, False, seed=m + 5 * n + 11 * k)


@pytest.mark.parametrize("dtype", ["f32", "f64", "i32"])
@SETTINGS
@given(data=st.data(), ta=st.booleans())
def test_small_products_b_transposed(dtype: str, data, ta: bool) -> None:
    """B transposed, below the BLAS's size: the loops take each element as a dot product along
    the depth (integers exactly, in wrapping arithmetic as numpy's)."""
    m, n = data.draw(st.integers(1, 30), label="m"), data.draw(st.integers(1, 40), label="n")
    k = data.draw(st.integers(1, min(200, max(1, (matmul_kernels.BLAS_MIN_FLOPS - 1) // (m * n)))),
                  label="k")
    if dtype != "i32":
        run_and_check(dtype, (), m, n, k, ta, True, seed=m + 3 * n + 17 * k)
        return
    sa, t = ((k, m) if ta else (m, k)), ty(dtype, (m, n))
    mod = parse(f"module @m\nfunc @f(%a: {ty(dtype, sa)}, %b: {ty(dtype, (n, k))}) -> {t} {{\n"
                f"  %c = matmul_t %a, %b, ta={int(ta)}, tb=1 : {t}\n  return %c\n}}")
    rng = np.random.default_rng(m + n + k)
    a = rng.integers(-2**31, 2**31, sa, dtype=np.int32)
    b = rng.integers(-2**31, 2**31, (n, k), dtype=np.int32)
    got = compile_module(mod, cache_dir=None)("f", a, b)
    np.testing.assert_array_equal(got, (a.T if ta else a) @ b.T)
    np.testing.assert_array_equal(got, eqsat.interpret(mod, "f", a, b))


def test_paths() -> None:
    """Narrow products leave the BLAS whatever their layout (A transposed: the `columns` form;
    B transposed: `dots`; both as stored: `rows`). Small and integer products with B's rows
    contiguous leave the scalar loops; with B transposed they stay there (as dot products)."""
    wide = narrow_matmul.lanes(DType.f32) + 1
    for ta, tb in [(0, 0), (1, 0), (1, 1), (0, 1)]:
        hits = paths(product_module("f32", (), 256, min(10, wide - 1), 512, bool(ta), bool(tb)))
        assert hits.get("narrow_matmul", 0) == 2 and hits.get("blas", 0) == 0, (ta, tb, hits)
    wide_paths = paths(product_module("f32", (), 256, wide, 512, True, False))
    assert wide_paths.get("narrow_matmul", 0) == 0
    assert paths(product_module("f64", (), 20, 30, 40, False, False)).get("narrow_matmul", 0) == 2
    src = ("module @m\nfunc @f(%a: i32[20,30], %b: i32[{}]) -> i32[20,5] {{\n"
           "  %c = matmul_t %a, %b, ta=0, tb={} : i32[20,5]\n  return %c\n}}")
    assert paths(parse(src.format("30,5", 0))).get("narrow_matmul", 0) == 1
    assert paths(parse(src.format("5,30", 1))).get("loop_matmul", 0) == 1


@pytest.mark.parametrize("dtype", ["f32", "f64"])
def test_256_bit_path(monkeypatch, dtype: str) -> None:
    """AVX2's 8 or 4 lanes: narrow means fewer columns, and the masks and blocks follow."""
    monkeypatch.setattr(jit, "vector_bits", lambda: 256)
    w = narrow_matmul.lanes(DType(dtype))
    assert w * 8 * np.dtype(DTYPES[dtype]).itemsize == 256
    for ta in (False, True):
        run_and_check(dtype, (), 4 * w + 3, w - 1, 37, ta, False, seed=w)
        run_and_check(dtype, (), 9, 3 * w + 2, 11, ta, False, seed=w + 1)


@pytest.mark.parametrize("ta", [False, True])
def test_threaded_shares(monkeypatch, ta: bool) -> None:
    """Split over threads in blocks of rows: the same products as on one thread, exactly."""
    monkeypatch.setattr(parallel, "PARALLEL_MIN_WORK", 1)
    mod = product_module("f32", (2,), 333, 10, 70, ta, False)
    f = mod["f"]
    rng = np.random.default_rng(3)
    args = [rng.uniform(-1, 1, p.type.shape).astype(np.float32) for p in f.params]
    threaded = compile_module(mod, cache_dir=None)("f", *args)
    monkeypatch.setattr(parallel, "PARALLEL_MIN_WORK", 1 << 62)
    single = compile_module(parse(str(mod).replace("@m", "@single", 1)), cache_dir=None)(
        "f", *args)
    for x, y in zip(threaded, single):
        np.testing.assert_array_equal(x, y)
