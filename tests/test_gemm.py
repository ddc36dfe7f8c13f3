"""The generated packed GEMM (eqsat/backend/gemm.py): products of hypothesis-drawn shapes,
through the public compile path, against numpy in float64 and the interpreter."""

from __future__ import annotations

import re
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import eqsat
from eqsat.backend import compile_module, emit_llvm, gemm, jit
from eqsat.ir import parse
from eqsat.ir.ops import OPS

SETTINGS = settings(max_examples=18, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
# Large enough for the GEMM (matmul_kernels.BLAS_MIN_FLOPS multiply-adds), small enough to be fast.
MIN_MACS = 64 * 64 * 64
DTYPES = {"f32": np.float32, "f64": np.float64}
EPS = {"f32": 2.0 ** -24, "f64": 2.0 ** -53}

fused = pytest.mark.skipif("matmul_epi" not in OPS, reason="fused ops not registered")


@pytest.fixture(autouse=True)
def every_product(monkeypatch):
    """Lone products too (EQSAT_GEMM=all, the default): the tests are about the GEMM's
    arithmetic, whatever the environment says."""
    monkeypatch.setattr(gemm, "LONE_PRODUCTS", True)


def ty(dtype: str, shape) -> str:
    return f"{dtype}[{','.join(map(str, shape))}]"


def check(got: np.ndarray, want: np.ndarray, k: int, dtype: str, mags: float = 1.0) -> None:
    """Within a rounding bound of a k-term sum of products of magnitude `mags`."""
    assert got.shape == want.shape and got.dtype == np.dtype(DTYPES[dtype])
    tol = 4 * (k + 2) * EPS[dtype] * mags
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=0, atol=tol)


def dims(data, lo: int = 1, hi: int = 300) -> tuple[int, int, int]:
    """m, n, k with m*n*k large enough for the GEMM (any remainders of its tiles)."""
    m = data.draw(st.integers(lo, hi), label="m")
    n = data.draw(st.integers(lo, hi), label="n")
    k_min = max(1, -(-MIN_MACS // (m * n)))
    k = data.draw(st.integers(min(k_min, hi), hi), label="k")
    if m * n * k < MIN_MACS:
        k = hi  # m * n tiny: still a product of the GEMM's size is drawn from m, n
    return m, n, k


def uses_gemm(module) -> bool:
    return "eqsat.gemm.drv" in emit_llvm(module)


@pytest.mark.parametrize("dtype", ["f32", "f64"])
@SETTINGS
@given(data=st.data())
def test_matmul_shapes(dtype: str, data) -> None:
    """Plain and batched matmul: every remainder of MR, NR and KC, batches that split or not."""
    m, n, k = dims(data)
    batch = data.draw(st.sampled_from([(), (1,), (3,), (2, 2)]), label="batch")
    sa, sb, so = (*batch, m, k), (*batch, k, n), (*batch, m, n)
    mod = parse(f"module @m\nfunc @f(%a: {ty(dtype, sa)}, %b: {ty(dtype, sb)}) -> "
                f"{ty(dtype, so)} {{\n  %c = matmul %a, %b : {ty(dtype, so)}\n  return %c\n}}")
    rng = np.random.default_rng(m * 7 + n * 3 + k)
    a, b = (rng.uniform(-1, 1, s).astype(DTYPES[dtype]) for s in (sa, sb))
    got = compile_module(mod, cache_dir=None)("f", a, b)
    check(got, a.astype(np.float64) @ b.astype(np.float64), k, dtype)
    check(got, eqsat.interpret(mod, "f", a, b).astype(np.float64), k, dtype)


@fused
@pytest.mark.parametrize("dtype", ["f32", "f64"])
@SETTINGS
@given(data=st.data(), ta=st.booleans(), tb=st.booleans())
def test_matmul_t_and_epilogue(dtype: str, data, ta: bool, tb: bool) -> None:
    """Transposed operands read in place, and epilogues with a bias row and a residual read
    per element, on the rows and column blocks the GEMM finishes."""
    m, n, k = dims(data)
    batch = data.draw(st.sampled_from([(), (2,)]), label="batch")
    sa = (*batch, k, m) if ta else (*batch, m, k)
    sb = (*batch, n, k) if tb else (*batch, k, n)
    so = (*batch, m, n)
    t = ty(dtype, so)
    body = "body=add(relu(add($0, $1)), mul($2, $2))"
    mod = parse(f"""module @m
func @f(%a: {ty(dtype, sa)}, %b: {ty(dtype, sb)}, %bias: {dtype}[{n}], %res: {t}) -> ({t}, {t}) {{
  %c = matmul_t %a, %b, ta={int(ta)}, tb={int(tb)} : {t}
  %e = matmul_epi %a, %b, %bias, %res, ta={int(ta)}, tb={int(tb)}, {body} : {t}
  return %c, %e
}}""")
    rng = np.random.default_rng(m + 5 * n + 11 * k)
    a, b, bias, res = (rng.uniform(-1, 1, s).astype(DTYPES[dtype]) for s in (sa, sb, (n,), so))
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    prod = np.swapaxes(a64, -1, -2) if ta else a64
    prod = prod @ (np.swapaxes(b64, -1, -2) if tb else b64)
    c, e = compile_module(mod, cache_dir=None)("f", a, b, bias, res)
    check(c, prod, k, dtype)
    check(e, np.maximum(prod + bias, 0) + res.astype(np.float64) ** 2, k, dtype, mags=2.0)
    ic, ie = eqsat.interpret(mod, "f", a, b, bias, res)
    check(c, ic.astype(np.float64), k, dtype)
    check(e, ie.astype(np.float64), k, dtype, mags=2.0)


@SETTINGS
@given(data=st.data(), perm_a=st.sampled_from([(0, 2, 1), (1, 0, 2), (1, 2, 0)]))
def test_viewed_operands(data, perm_a) -> None:
    """A transpose feeding only a matmul is read in place through its strides (`views`),
    batch axes permuted too."""
    m, n, k = dims(data, 1, 120)
    bt = 3
    out_a = (bt, m, k)
    src_a = tuple(out_a[perm_a.index(i)] for i in range(3))
    mod = parse(f"""module @m
func @f(%x: {ty('f32', src_a)}, %y: f32[{bt},{n},{k}]) -> f32[{bt},{m},{n}] {{
  %a = transpose %x, perm=[{','.join(map(str, perm_a))}] : {ty('f32', out_a)}
  %b = transpose %y, perm=[0,2,1] : f32[{bt},{k},{n}]
  %c = matmul %a, %b : f32[{bt},{m},{n}]
  return %c
}}""")
    rng = np.random.default_rng(m * n + k)
    x = rng.uniform(-1, 1, src_a).astype(np.float32)
    y = rng.uniform(-1, 1, (bt, n, k)).astype(np.float32)
    got = compile_module(mod, cache_dir=None)("f", x, y)
    want = np.transpose(x, perm_a).astype(np.float64) @ np.transpose(y, (0, 2, 1))
    check(got, want, k, "f32")
    check(got, eqsat.interpret(mod, "f", x, y).astype(np.float64), k, "f32")


@pytest.mark.parametrize("dtype", ["f32", "f64"])
def test_blas_reads_a_transposed_column_in_place(dtype: str) -> None:
    """A [k,1] column transposed to [1,k] has strides [1,1]: the BLAS reads it in place as a
    transposed operand, the one form whose leading dimension is valid (the other, chosen by
    the contiguous last axis alone, made OpenBLAS refuse the call and left the result NaN)."""
    k, n = 512, 600
    t = dtype
    mod = parse(f"""module @m
func @f(%a: {t}[{k},1], %b: {t}[{k},{n}], %c: {t}[{n},1]) -> ({t}[1,{n}], {t}[{k},1]) {{
  %at = transpose %a, perm=[1,0] : {t}[1,{k}]
  %p = matmul %at, %b : {t}[1,{n}]
  %ct = transpose %c, perm=[1,0] : {t}[1,{n}]
  %bt = transpose %b, perm=[1,0] : {t}[{n},{k}]
  %q = matmul %ct, %bt : {t}[1,{k}]
  %qt = reshape %q : {t}[{k},1]
  return %p, %qt
}}""")
    rng = np.random.default_rng(3)
    a, b, c = (rng.uniform(-1, 1, s).astype(DTYPES[dtype]) for s in ((k, 1), (k, n), (n, 1)))
    p, q = compile_module(mod, cache_dir=None)("f", a, b, c)
    check(p, a.T.astype(np.float64) @ b, k, dtype)
    check(q, (c.T.astype(np.float64) @ b.T).T, n, dtype)


def test_gemm_is_the_path_and_blas_stays() -> None:
    """Float products of BLAS size go to the generated GEMM, but for narrow ones that would
    be mostly padding; switched off, to the BLAS, and both give the same products; integer
    products stay loops."""
    src = ("module @m\nfunc @{name}(%a: {d}[70,90], %b: {d}[90,120]) -> {d}[70,120] {{\n"
           "  %c = matmul %a, %b : {d}[70,120]\n  return %c\n}}")
    mod = parse(src.format(name="g", d="f32"))
    assert uses_gemm(mod)
    assert not uses_gemm(parse(src.format(name="g", d="i32")))
    narrow = parse("module @m\nfunc @n(%a: f32[256,1024], %b: f32[1024,10]) -> f32[256,10] {\n"
                   "  %c = matmul %a, %b : f32[256,10]\n  return %c\n}")
    assert not uses_gemm(narrow)
    rng = np.random.default_rng(0)
    a = rng.uniform(-1, 1, (70, 90)).astype(np.float32)
    b = rng.uniform(-1, 1, (90, 120)).astype(np.float32)
    ours = compile_module(mod, cache_dir=None)("g", a, b)
    gemm.LONE_PRODUCTS = False  # EQSAT_GEMM=batched: lone products on the BLAS, batched not
    assert not uses_gemm(parse(src.format(name="lone", d="f32")))
    batched = parse("module @m\nfunc @bt(%a: f32[2,70,90], %b: f32[2,90,120]) -> "
                    "f32[2,70,120] {\n  %c = matmul %a, %b : f32[2,70,120]\n  return %c\n}")
    assert uses_gemm(batched)
    old = gemm.ENABLED
    gemm.ENABLED = False
    try:
        blas_mod = parse(src.format(name="via_blas", d="f32"))
        assert not uses_gemm(blas_mod)
        theirs = compile_module(blas_mod, cache_dir=None)("via_blas", a, b)
    finally:
        gemm.ENABLED = old
    check(ours, theirs.astype(np.float64), 90, "f32")


@pytest.mark.parametrize("dtype", ["f32", "f64"])
def test_256_bit_path(monkeypatch, dtype: str) -> None:
    """The AVX2 blocking (8 or 4 lanes, 12 accumulators) on edge shapes, run on this host."""
    monkeypatch.setattr(jit, "vector_bits", lambda: 256)
    bl = gemm.blocking(eqsat.ir.DType(dtype))
    assert bl.lanes * 8 * np.dtype(DTYPES[dtype]).itemsize == 256
    m, k, n = 4 * bl.mr + 1, 3 * bl.kc + 5, 3 * bl.nr + 7
    mod = parse(f"module @m\nfunc @avx2_{dtype}(%a: {dtype}[{k},{m}], %b: {dtype}[{n},{k}]) -> "
                f"{dtype}[{m},{n}] {{\n  %c = matmul_t %a, %b, ta=1, tb=1 : {dtype}[{m},{n}]\n"
                f"  return %c\n}}")
    assert uses_gemm(mod)
    rng = np.random.default_rng(4)
    a = rng.uniform(-1, 1, (k, m)).astype(DTYPES[dtype])
    b = rng.uniform(-1, 1, (n, k)).astype(DTYPES[dtype])
    got = compile_module(mod, cache_dir=None)(f"avx2_{dtype}", a, b)
    check(got, a.T.astype(np.float64) @ b.T, k, dtype)


def test_threads_share_one_product() -> None:
    """One product large enough for threads, split in equal shares: exact either way."""
    m, k, n = 200, 300, 260
    mod = parse(f"module @m\nfunc @f(%a: f32[{m},{k}], %b: f32[{k},{n}]) -> f32[{m},{n}] {{\n"
                f"  %c = matmul %a, %b : f32[{m},{n}]\n  return %c\n}}")
    rng = np.random.default_rng(1)
    a, b = rng.uniform(-1, 1, (m, k)).astype(np.float32), rng.uniform(-1, 1, (k, n)).astype(
        np.float32)
    exe = compile_module(mod, cache_dir=None)
    want = a.astype(np.float64) @ b
    for _ in range(3):
        check(exe("f", a, b), want, k, "f32")


def test_concurrent_calls() -> None:
    """Python threads calling one compiled product at once: each call packs into its own
    stack buffers, so all results are exact."""
    import threading

    m, k, n = 150, 200, 140
    mod = parse(f"module @m\nfunc @cc(%a: f32[{m},{k}], %b: f32[{k},{n}]) -> f32[{m},{n}] {{\n"
                f"  %c = matmul %a, %b : f32[{m},{n}]\n  return %c\n}}")
    exe = compile_module(mod, cache_dir=None)
    rng = np.random.default_rng(5)
    pairs = [(rng.uniform(-1, 1, (m, k)).astype(np.float32),
              rng.uniform(-1, 1, (k, n)).astype(np.float32)) for _ in range(4)]
    got: dict[int, list[np.ndarray]] = {}

    def work(t: int) -> None:
        a, b = pairs[t]
        got[t] = [exe("cc", a, b) for _ in range(5)]

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for t, (a, b) in enumerate(pairs):
        for c in got[t]:
            check(c, a.astype(np.float64) @ b, k, "f32")


def test_split_shares_are_equal() -> None:
    """`split` cuts a lone product into one share per thread along its larger side, whole
    tiles each; batches split whole."""
    bl = gemm.blocking(eqsat.ir.DType.f32)
    sp = gemm.split(1, 256, 1024, bl, 2)
    assert sp.by_cols and sp.parts == 2 and sp.chunk == 512
    sp = gemm.split(1, 1000, 100, bl, 2)
    assert not sp.by_cols and sp.parts == 2 and sp.chunk % bl.mr == 0
    assert gemm.split(64, 128, 128, bl, 2).parts == 1


def test_one_driver_for_many_products() -> None:
    """Products of different shapes, layouts and epilogues in one module share one driver
    per dtype, called with run-time shapes and strides, from the GEMM runtime (the module
    declares it and compiles none of it): each result exact."""
    mod = parse("""module @m
func @f(%a: f32[70,90], %b: f32[90,130], %at: f32[2,50,61], %bt: f32[2,200,50], %bias: f32[130],
        %d: f64[48,300], %e: f64[300,64]) -> (f32[70,130], f32[2,61,200], f32[70,130], f64[48,64]) {
  %c = matmul %a, %b : f32[70,130]
  %g = matmul_t %at, %bt, ta=1, tb=1 : f32[2,61,200]
  %h = matmul_epi %a, %b, %bias, ta=0, tb=0, body=mul(add($0, $1), $1) : f32[70,130]
  %k = matmul %d, %e : f64[48,64]
  return %c, %g, %h, %k
}""")
    text = emit_llvm(mod)
    for dtype in ("f32", "f64"):
        assert len(re.findall(rf"declare .*@\"?eqsat\.gemm\.drv\.{dtype}\"?\(", text)) == 1
    assert not re.search(r"define .*eqsat\.gemm", text)
    rng = np.random.default_rng(7)
    shapes = [(70, 90), (90, 130), (2, 50, 61), (2, 200, 50), (130,), (48, 300), (300, 64)]
    args = [rng.uniform(-1, 1, s).astype(np.float64 if i >= 5 else np.float32)
            for i, s in enumerate(shapes)]
    a, b, at, bt, bias, d, e = (x.astype(np.float64) for x in args)
    c, g, h, k = compile_module(mod, cache_dir=None)("f", *args)
    check(c, a @ b, 90, "f32")
    check(g, np.swapaxes(at, -1, -2) @ np.swapaxes(bt, -1, -2), 50, "f32")
    check(h, (a @ b + bias) * bias, 90, "f32", mags=2.0)
    check(k, d @ e, 300, "f64")


def test_driver_reads_any_strides() -> None:
    """The shared driver reads op(A) and op(B) through any element strides, neither matrix
    axis contiguous (views the entry never makes today) and batch strides too."""
    import ctypes

    from llvmlite import ir

    from eqsat.backend import jit
    from eqsat.backend.llvm_kernels import KernelBuilder
    from eqsat.ir import DType, TensorType

    bt, m, k, n = 2, 50, 70, 90
    f32 = DType.f32
    module = ir.Module(name="strides")
    module.triple, module.data_layout = jit.host()[0], jit.data_layout()
    kb = KernelBuilder(module)
    out, ins = TensorType(f32, (bt, m, n)), [TensorType(f32, (bt, m, k)),
                                             TensorType(f32, (bt, k, n))]
    # A[t, i, p] = x[p, i, t] for x stored (k, m, bt); B[t, p, j] = y[j, p, t], y (n, k, bt).
    views = [(1, bt, m * bt), (1, bt, k * bt)]
    kernels = [gemm.gemm_matmul(kb, "viewed", out, ins, False, False, None, views),
               gemm.gemm_matmul(kb, "plain", out, ins, False, False, None)]
    p = ir.FloatType().as_pointer()
    for kernel, name in zip(kernels, ("viewed", "plain")):
        run = ir.Function(module, ir.FunctionType(ir.VoidType(), [p, p, p]), f"run_{name}")
        b = ir.IRBuilder(run.append_basic_block("entry"))
        b.call(kernel.fn, [ir.Constant(ir.IntType(64), 0),
                           ir.Constant(ir.IntType(64), kernel.extent), *run.args])
        b.ret_void()
    code = jit.Code(jit.compile_object(str(module)))
    rng = np.random.default_rng(8)
    x, y = (rng.uniform(-1, 1, s).astype(np.float32) for s in ((k, m, bt), (n, k, bt)))
    a, bb = np.ascontiguousarray(np.transpose(x, (2, 1, 0))), np.ascontiguousarray(
        np.transpose(y, (2, 1, 0)))
    fptr = ctypes.POINTER(ctypes.c_float)
    for name, args in (("viewed", (x, y)), ("plain", (a, bb))):
        c = np.full((bt, m, n), np.nan, np.float32)
        fn = ctypes.CFUNCTYPE(None, fptr, fptr, fptr)(code.address(f"run_{name}"))
        fn(*(t.ctypes.data_as(fptr) for t in (c, *args)))
        check(c, a.astype(np.float64) @ bb, k, "f32")


SMALL_STACK = """
import threading
import numpy as np
import eqsat
from eqsat.backend import compile_module
threading.stack_size(256 << 10)
m = eqsat.parse('''module @m
func @f(%a: f32[256,512], %b: f32[512,384]) -> f32[256,384] {
  %c = matmul %a, %b : f32[256,384]
  return %c
}''')
a = np.linspace(-1, 1, 256 * 512, dtype=np.float32).reshape(256, 512)
b = np.cos(np.arange(512 * 384, dtype=np.float32)).reshape(512, 384)
exe = compile_module(m, cache_dir=None)
out = []
t = threading.Thread(target=lambda: out.append(bool(np.allclose(exe.f(a, b), a @ b, rtol=1e-4,
                                                                atol=1e-3))))
t.start()
t.join()
print(out)
"""


def test_a_thread_with_a_small_stack_runs_a_product() -> None:
    """The driver's ~0.7 MiB of packing buffers come from the heap: on the stack they
    overflowed a 256 KiB thread stack (the process died with SIGSEGV), since the calling
    thread runs a share of the product itself."""
    out = subprocess.run([sys.executable, "-c", SMALL_STACK], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[True]"
